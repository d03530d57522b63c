"""Per-token logit edits before temperature: ``logit_bias`` and the hard masks
(``min_tokens`` and structured-output allowed sets).

- ``logit_bias``: each row's ``{token_id: bias}`` is added to its logits (before the
  penalties, as vLLM does). A bias of -100 makes a token practically unreachable, +100
  practically certain, but never past a hard mask.

The masks set forbidden tokens to ``-inf`` after the bias and penalties, so neither greedy
nor random sampling can pick them, whatever the bias.

- ``min_tokens``: while a row has produced fewer than ``min_tokens`` tokens, its EOS ids
  (``params.eos_token_ids``, masked even when ``ignore_eos`` is set: ``ignore_eos`` only
  tells the scheduler not to stop) and its ``stop_token_ids`` are forbidden.
- ``allowed_token_masks``: one bool ``[V']`` tensor per row (or ``None``: no
  constraint). ``V'`` may be smaller than the model's vocabulary (tokenizers often have
  fewer tokens than the padded embedding); the ids past ``V'`` are then forbidden. Or, the
  engine's path, ``PackedMasks``: a packed row for every row, already on the logits'
  device, unpacked there in one gather (``apply_packed_masks``; out of place, it is also
  the sampler's working copy of the logits).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from engine.model_executor.device_tensors import host_tensor, to_device
from engine.sampling_params import SamplingParams
from engine.structured_output.masks import PackedMasks

NEG_INF = float("-inf")


def apply_logit_bias(logits: torch.Tensor, params: Sequence[SamplingParams]) -> torch.Tensor:
    """Add each row's ``logit_bias`` to its logits; in place, one indexed add on the device."""
    vocab_size = logits.shape[1]
    assert logits.is_contiguous(), "apply_logit_bias adds through a flat view of the logits"
    flat_ids: list[int] = []
    values: list[float] = []
    for i, p in enumerate(params):
        for token_id, bias in (p.logit_bias or {}).items():
            # Checked against the tokenizer at the API; a padded vocabulary is larger, a
            # tokenizer larger than the logits (rare) has ids that cannot be sampled anyway.
            if 0 <= token_id < vocab_size:
                flat_ids.append(i * vocab_size + token_id)
                values.append(bias)
    if flat_ids:
        index = host_tensor(flat_ids, torch.long, logits.device)
        logits.view(-1).index_add_(0, index, host_tensor(values, logits.dtype, logits.device))
    return logits


def apply_min_tokens(
    logits: torch.Tensor,
    params: Sequence[SamplingParams],
    output_token_ids: Sequence[Sequence[int]],
) -> torch.Tensor:
    """Forbid EOS and stop token ids in rows still short of ``min_tokens``; in place."""
    vocab_size = logits.shape[1]
    assert logits.is_contiguous(), "apply_min_tokens fills a flat view of the logits"
    # Flat indices (row * V + token) and index_fill_: assigning a Python scalar through
    # logits[rows, cols] would copy the scalar from pageable memory, a host sync on CUDA.
    flat_ids: list[int] = []
    for i, p in enumerate(params):
        if p.min_tokens <= 0 or len(output_token_ids[i]) >= p.min_tokens:
            continue
        # Ids outside the vocabulary cannot be sampled anyway; an EOS id of a tokenizer
        # larger than the model's logits is not worth failing a request for.
        banned = {t for t in (*p.eos_token_ids, *p.stop_token_ids) if 0 <= t < vocab_size}
        flat_ids.extend(i * vocab_size + t for t in sorted(banned))
    if flat_ids:
        logits.view(-1).index_fill_(0, host_tensor(flat_ids, torch.long, logits.device), NEG_INF)
    return logits


def apply_packed_masks(
    logits: torch.Tensor, masks: PackedMasks, in_place: bool = True
) -> torch.Tensor:
    """Set every token a row's packed mask does not allow to ``-inf``; ``in_place=False``
    returns a new tensor (the copy and the fill in one pass over the logits)."""
    num_rows, vocab_size = logits.shape
    if len(masks) != num_rows or masks.vocab_size != vocab_size:
        raise ValueError(
            f"packed masks for {len(masks)} rows of {masks.vocab_size} tokens, logits of "
            f"{num_rows} rows of {vocab_size}; build the masks for the sampled rows and the "
            "model's vocabulary size"
        )
    if masks.bits.device != logits.device:
        raise ValueError(
            f"packed masks are on {masks.bits.device}, the logits on {logits.device}; "
            "build them on the logits' device"
        )
    forbidden = masks.forbidden()
    if in_place:
        return logits.masked_fill_(forbidden, NEG_INF)
    return logits.masked_fill(forbidden, NEG_INF)


def apply_allowed_token_masks(
    logits: torch.Tensor, allowed_token_masks: Sequence[torch.Tensor | None] | PackedMasks
) -> torch.Tensor:
    """Set every token a row's mask does not allow to ``-inf``; in place."""
    if isinstance(allowed_token_masks, PackedMasks):
        return apply_packed_masks(logits, allowed_token_masks)
    num_rows, vocab_size = logits.shape
    if len(allowed_token_masks) != num_rows:
        raise ValueError(
            f"allowed_token_masks has {len(allowed_token_masks)} entries for {num_rows} "
            "rows of logits; pass one mask (or None) per row"
        )
    present = [(i, m) for i, m in enumerate(allowed_token_masks) if m is not None]
    if not present:
        return logits
    # Built where the masks live (host masks: one copy for the batch), then moved.
    masks_on_host = all(m.device.type == "cpu" for _, m in present)
    build_device = torch.device("cpu") if masks_on_host else logits.device
    allowed = torch.zeros(len(present), vocab_size, dtype=torch.bool, device=build_device)
    for j, (i, mask) in enumerate(present):
        if mask.dim() != 1 or mask.dtype != torch.bool:
            raise ValueError(
                f"allowed_token_masks[{i}] must be a 1-D bool tensor, got "
                f"{mask.dtype} of shape {tuple(mask.shape)}"
            )
        if mask.shape[0] > vocab_size:
            raise ValueError(
                f"allowed_token_masks[{i}] covers {mask.shape[0]} tokens but the logits "
                f"have {vocab_size}; build the mask for the model's vocabulary size"
            )
        allowed[j, : mask.shape[0]] = mask.to(build_device)
    allowed = to_device(allowed, logits.device)
    row_index = host_tensor([i for i, _ in present], torch.long, logits.device)
    logits[row_index] = logits[row_index].masked_fill(~allowed, NEG_INF)
    return logits
