"""Log-probabilities of chosen tokens, their ranks and the top-k alternatives.

Logprobs are those of the RAW model logits (``log_softmax`` before penalties, masks,
temperature and truncation): vLLM's default ``logprobs_mode="raw_logprobs"``, and what
the OpenAI API reports. So a greedy token under a repetition penalty may have rank > 1.

Everything for a batch is gathered on the device into one float64 tensor and copied to
the host once (float64 holds every token id and every float32 logprob exactly)::

    column  0         1         2     3 .. 3+k-1      3+k .. 3+2k-1
            token_id  logprob   rank  top_token_ids   top_logprobs
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from engine.core.scheduler_output import Logprobs
from engine.model_executor.device_tensors import host_tensor

_NUM_FIXED_COLUMNS = 3


def gather_logprobs(logprobs: torch.Tensor, token_ids: torch.Tensor, num_top: int) -> torch.Tensor:
    """Pack the chosen tokens' logprobs, ranks and the top ``num_top`` per row.

    ``logprobs``: float32 ``[m, V]`` (a log-softmax); ``token_ids``: long ``[m]`` on the
    same device. Returns float64 ``[m, 3 + 2 * num_top]`` in the layout above.
    """
    num_top = min(num_top, logprobs.shape[1])
    token_ids = token_ids.to(torch.long)[:, None]
    chosen = logprobs.gather(1, token_ids)
    # Rank 1 = best; ties share the better rank (vLLM's definition).
    rank = (logprobs > chosen).sum(dim=-1, keepdim=True) + 1
    columns = [token_ids.double(), chosen.double(), rank.double()]
    if num_top > 0:
        top = logprobs.topk(num_top, dim=-1)
        columns += [top.indices.double(), top.values.double()]
    return torch.cat(columns, dim=1)


def unpack_logprobs(row: Sequence[float], num_top: int) -> Logprobs:
    """One host row of ``gather_logprobs`` (possibly wider than ``num_top`` needs)."""
    width = (len(row) - _NUM_FIXED_COLUMNS) // 2
    top_ids = row[_NUM_FIXED_COLUMNS : _NUM_FIXED_COLUMNS + num_top]
    top_values = row[_NUM_FIXED_COLUMNS + width : _NUM_FIXED_COLUMNS + width + num_top]
    return Logprobs(
        token_id=int(row[0]),
        logprob=float(row[1]),
        rank=int(row[2]),
        top_token_ids=[int(t) for t in top_ids],
        top_logprobs=[float(v) for v in top_values],
    )


def compute_prompt_logprobs(
    logits: torch.Tensor, target_token_ids: list[int], num_logprobs: int
) -> list[Logprobs]:
    """Row ``i`` of ``logits`` ``[m, V]`` predicts ``target_token_ids[i]``; one
    ``Logprobs`` per row with the top ``num_logprobs`` alternatives. One host sync."""
    packed = gather_prompt_logprobs(logits, target_token_ids, num_logprobs)
    return unpack_prompt_logprobs(packed.cpu(), num_logprobs)


def gather_prompt_logprobs(
    logits: torch.Tensor, target_token_ids: list[int], num_logprobs: int
) -> torch.Tensor:
    """``compute_prompt_logprobs`` without the host copy: the packed rows on the device."""
    num_rows, vocab_size = logits.shape
    if len(target_token_ids) != num_rows:
        raise ValueError(
            f"compute_prompt_logprobs got {num_rows} rows of logits for "
            f"{len(target_token_ids)} target token ids; pass one target per row"
        )
    if num_logprobs < 0:
        raise ValueError(f"prompt_logprobs must be >= 0, got {num_logprobs}")
    num_top = min(num_logprobs, vocab_size)
    if num_rows == 0:
        return torch.empty((0, _NUM_FIXED_COLUMNS + 2 * num_top), dtype=torch.float64)
    if min(target_token_ids) < 0 or max(target_token_ids) >= vocab_size:
        raise ValueError(
            f"target_token_ids must lie in [0, {vocab_size}) (the model's vocabulary); "
            "check that the tokenizer matches the model"
        )
    logprobs = logits.float().log_softmax(dim=-1)
    targets = host_tensor(target_token_ids, torch.long, logits.device)
    return gather_logprobs(logprobs, targets, num_top)


def unpack_prompt_logprobs(packed: torch.Tensor, num_logprobs: int) -> list[Logprobs]:
    """The host rows of ``gather_prompt_logprobs``."""
    num_top = min(num_logprobs, (packed.shape[1] - _NUM_FIXED_COLUMNS) // 2)
    return [unpack_logprobs(row, num_top) for row in packed.tolist()]
