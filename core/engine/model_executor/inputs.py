"""Turn one ``SchedulerOutput`` into the model's step inputs (built on the host, one copy each).

Tokens are packed request after request. Each token's cache slot comes from its
request's block table::

    position p  ->  slot = block_ids[p // block_size] * block_size + p % block_size

    block_size 4, block_ids [7, 2], positions 3..5:
        p=3 -> 7*4+3 = 31      p=4 -> 2*4+0 = 8      p=5 -> 2*4+1 = 9

Logits are computed only for the rows that need them, in this order: first the prompt
positions of requests that asked for prompt logprobs (position p predicts prompt token
p + 1), then one row per sampling request (its last token this step).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import torch
from engine_sdk.interfaces.attention import AttentionBatch

from engine.core.request import ReqId
from engine.core.scheduler_output import ScheduledRequest, SchedulerOutput

__all__ = ["PromptLogprobsRows", "StepInputs", "build_step_inputs"]


@dataclass
class PromptLogprobsRows:
    """Rows ``[first_row, first_row + len(target_token_ids))`` of the step's logits."""

    req_id: ReqId
    first_row: int
    target_token_ids: list[int]
    num_logprobs: int


@dataclass
class StepInputs:
    input_ids: torch.Tensor  # int64 [num_tokens]
    positions: torch.Tensor  # int64 [num_tokens]
    attn_batch: AttentionBatch
    logits_indices: torch.Tensor  # int64 [num_logits_rows]: rows of the hidden states
    sample_requests: list[ScheduledRequest] = field(default_factory=list)
    num_prompt_rows: int = 0  # sample rows start after the prompt-logprob rows
    prompt_rows: list[PromptLogprobsRows] = field(default_factory=list)


def _slots(sr: ScheduledRequest, block_size: int) -> np.ndarray:
    positions = np.arange(sr.start_position, sr.start_position + sr.num_tokens)
    blocks = np.asarray(sr.block_ids, dtype=np.int64)
    last = int(positions[-1]) if len(positions) else -1
    if last >= len(blocks) * block_size:
        raise ValueError(
            f"request {sr.req_id}: position {last} is beyond its block table "
            f"({len(blocks)} blocks of {block_size} tokens)"
        )
    return blocks[positions // block_size] * block_size + positions % block_size


def _prompt_rows(
    sr: ScheduledRequest, first_token_row: int, num_done: int
) -> tuple[list[int], PromptLogprobsRows | None]:
    """Hidden-state rows whose logits give prompt logprobs, skipping positions done before."""
    num_logprobs = sr.request.sampling_params.prompt_logprobs
    if num_logprobs is None:
        return [], None
    prompt = sr.request.prompt_token_ids
    first = max(sr.start_position, num_done)
    last = min(sr.start_position + sr.num_tokens, len(prompt) - 1)  # exclusive
    if first >= last:
        return [], None
    rows = [first_token_row + p - sr.start_position for p in range(first, last)]
    targets = prompt[first + 1 : last + 1]
    return rows, PromptLogprobsRows(sr.req_id, 0, targets, num_logprobs)


def build_step_inputs(
    so: SchedulerOutput,
    block_size: int,
    device: torch.device,
    prompt_logprobs_done: dict[ReqId, int],
) -> StepInputs:
    """Pack the step. ``prompt_logprobs_done[req_id]`` is the first prompt position whose
    logprobs are still owed (updated here), so a recomputed prompt is not reported twice."""
    input_ids: list[int] = []
    positions: list[np.ndarray] = []
    slots: list[np.ndarray] = []
    query_start = [0]
    seq_lens: list[int] = []
    prompt_hidden_rows: list[int] = []
    prompt_rows: list[PromptLogprobsRows] = []
    sample_hidden_rows: list[int] = []
    sample_requests: list[ScheduledRequest] = []
    for sr in so.scheduled:
        first_row = len(input_ids)
        input_ids.extend(sr.token_ids)
        positions.append(np.arange(sr.start_position, sr.start_position + sr.num_tokens))
        slots.append(_slots(sr, block_size))
        query_start.append(query_start[-1] + sr.num_tokens)
        seq_lens.append(sr.start_position + sr.num_tokens)
        rows, pl = _prompt_rows(sr, first_row, prompt_logprobs_done.get(sr.req_id, 0))
        if pl is not None:
            pl.first_row = len(prompt_hidden_rows)
            prompt_hidden_rows.extend(rows)
            prompt_rows.append(pl)
            prompt_logprobs_done[sr.req_id] = sr.start_position + sr.num_tokens
        if sr.sample:
            sample_hidden_rows.append(first_row + sr.num_tokens - 1)
            sample_requests.append(sr)
    num_cols = max(-(-n // block_size) for n in seq_lens) if seq_lens else 0
    tables = np.zeros((len(so.scheduled), num_cols), dtype=np.int32)
    for i, sr in enumerate(so.scheduled):
        used = sr.block_ids[: -(-seq_lens[i] // block_size)]
        tables[i, : len(used)] = used

    def to_device(array: np.ndarray | list[int], dtype: torch.dtype) -> torch.Tensor:
        return torch.as_tensor(np.asarray(array), dtype=dtype).to(device)

    attn_batch = AttentionBatch(
        query_start_loc=to_device(query_start, torch.int32),
        seq_lens=to_device(seq_lens, torch.int32),
        block_tables=to_device(tables, torch.int32),
        slot_mapping=to_device(np.concatenate(slots) if slots else [], torch.int64),
        max_query_len=max((sr.num_tokens for sr in so.scheduled), default=0),
        max_seq_len=max(seq_lens, default=0),
        num_seqs=len(so.scheduled),
        num_tokens=len(input_ids),
        query_start_loc_cpu=query_start,
        seq_lens_cpu=seq_lens,
    )
    return StepInputs(
        input_ids=to_device(input_ids, torch.int64),
        positions=to_device(np.concatenate(positions) if positions else [], torch.int64),
        attn_batch=attn_batch,
        logits_indices=to_device(prompt_hidden_rows + sample_hidden_rows, torch.int64),
        sample_requests=sample_requests,
        num_prompt_rows=len(prompt_hidden_rows),
        prompt_rows=prompt_rows,
    )
