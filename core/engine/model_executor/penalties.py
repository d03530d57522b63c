"""Repetition, presence and frequency penalties on a batch of logits.

Semantics (the ones the OpenAI API and Hugging Face ``generate`` use):

- ``repetition_penalty`` p (HF ``RepetitionPenaltyLogitsProcessor``): for every token that
  occurs in the prompt or the output so far, ``logit / p`` when the logit is positive,
  ``logit * p`` otherwise. 1.0 is off.
- ``presence_penalty`` a and ``frequency_penalty`` f (OpenAI): over the OUTPUT tokens
  only, ``logit -= a * (count > 0) + f * count``. 0.0 is off.

All rows are handled at once: the token lists are flattened into one index tensor
(``row_ids``, ``token_ids``) and scattered into ``[num_rows, vocab_size]`` counts, so no
Python loop touches the vocabulary. Rows with no penalty keep their logits bit for bit.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence

import numpy as np
import torch

from engine.model_executor.device_tensors import host_tensor, to_device
from engine.sampling_params import SamplingParams


def needs_penalties(params: Sequence[SamplingParams]) -> bool:
    return any(
        p.repetition_penalty != 1.0 or p.presence_penalty != 0.0 or p.frequency_penalty != 0.0
        for p in params
    )


def token_counts(
    token_id_lists: Sequence[Sequence[Sequence[int]]],
    vocab_size: int,
    device: torch.device,
) -> torch.Tensor:
    """Count each token id per row: float32 ``[len(token_id_lists), vocab_size]``.

    Row ``i`` counts the ids of all the lists in ``token_id_lists[i]`` (e.g. its prompt
    and its output), without concatenating them in Python::

        rows      [([5, 7], [5]), ([],), ([2],)]
        flat ids   0*V+5  0*V+7  0*V+5  2*V+2     (row * V + token)
        counts[0, 5] = 2, counts[0, 7] = 1, counts[2, 2] = 1
    """
    num_rows = len(token_id_lists)
    counts = torch.zeros(num_rows, vocab_size, dtype=torch.float32, device=device)
    lengths = np.fromiter(
        (sum(len(ids) for ids in parts) for parts in token_id_lists), np.int64, num_rows
    )
    total = int(lengths.sum())
    if total == 0:
        return counts
    # np.fromiter reads Python ints several times faster than torch.tensor(list).
    tokens = np.fromiter(
        itertools.chain.from_iterable(itertools.chain.from_iterable(token_id_lists)),
        np.int64,
        total,
    )
    row_ids = np.repeat(np.arange(num_rows, dtype=np.int64), lengths)
    # Ids past the logits' vocabulary (an embedding larger than the LM head) cannot be
    # sampled, so they need no penalty: dropped, as Hugging Face does. Filtered on the
    # host; on CUDA an out-of-range index would be a device-side assert.
    in_range = (tokens >= 0) & (tokens < vocab_size)
    if not in_range.all():
        tokens, row_ids = tokens[in_range], row_ids[in_range]
    flat_ids = torch.from_numpy(row_ids * vocab_size + tokens)
    ones = torch.ones(flat_ids.numel(), dtype=torch.float32, device=device)
    # Adding 1.0s is exact in float32 up to 2**24, so the accumulation order (which CUDA
    # does not fix) cannot change a count.
    counts.view(-1).index_add_(0, to_device(flat_ids, device), ones)
    return counts


def apply_penalties(
    logits: torch.Tensor,
    params: Sequence[SamplingParams],
    prompt_token_ids: Sequence[Sequence[int]],
    output_token_ids: Sequence[Sequence[int]],
) -> torch.Tensor:
    """Apply the three penalties to ``logits`` (float32 ``[num_rows, vocab_size]``) in place
    and return it. Only the rows that use a penalty are touched."""
    vocab_size = logits.shape[1]
    device = logits.device
    rep_rows = [i for i, p in enumerate(params) if p.repetition_penalty != 1.0]
    freq_rows = [
        i for i, p in enumerate(params) if p.presence_penalty != 0.0 or p.frequency_penalty != 0.0
    ]

    if rep_rows:
        # Prompt and output ids both count as "seen".
        seen_lists = [(prompt_token_ids[i], output_token_ids[i]) for i in rep_rows]
        seen = token_counts(seen_lists, vocab_size, device) > 0
        penalty = _column([params[i].repetition_penalty for i in rep_rows], device)
        sub = _take_rows(logits, rep_rows)
        penalised = torch.where(sub > 0, sub / penalty, sub * penalty)
        _put_rows(logits, rep_rows, torch.where(seen, penalised, sub))

    if freq_rows:
        counts = token_counts([(output_token_ids[i],) for i in freq_rows], vocab_size, device)
        presence = _column([params[i].presence_penalty for i in freq_rows], device)
        frequency = _column([params[i].frequency_penalty for i in freq_rows], device)
        sub = _take_rows(logits, freq_rows)
        sub -= presence * (counts > 0).to(torch.float32) + frequency * counts
        _put_rows(logits, freq_rows, sub)
    return logits


def _column(values: list[float], device: torch.device) -> torch.Tensor:
    return host_tensor(values, torch.float32, device)[:, None]


def _take_rows(logits: torch.Tensor, rows: list[int]) -> torch.Tensor:
    """The rows as a tensor to work on: the logits themselves when every row is taken."""
    if len(rows) == logits.shape[0]:
        return logits
    return logits[host_tensor(rows, torch.long, logits.device)]


def _put_rows(logits: torch.Tensor, rows: list[int], values: torch.Tensor) -> None:
    if values is logits:
        return
    if len(rows) == logits.shape[0]:
        logits.copy_(values)
    else:
        logits[host_tensor(rows, torch.long, logits.device)] = values
