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

import torch

from engine.model_executor.device_tensors import host_tensor, to_device
from engine.sampling_params import SamplingParams


def needs_penalties(params: Sequence[SamplingParams]) -> bool:
    return any(
        p.repetition_penalty != 1.0 or p.presence_penalty != 0.0 or p.frequency_penalty != 0.0
        for p in params
    )


def token_counts(
    token_id_lists: Sequence[Sequence[int]],
    vocab_size: int,
    device: torch.device,
) -> torch.Tensor:
    """Count each token id per row: float32 ``[len(token_id_lists), vocab_size]``.

    ::

        lists     [[5, 7, 5], [], [2]]
        row_ids    0  0  0         2        (repeat_interleave of the lengths)
        token_ids  5  7  5         2
        counts[0, 5] = 2, counts[0, 7] = 1, counts[2, 2] = 1
    """
    num_rows = len(token_id_lists)
    counts = torch.zeros(num_rows, vocab_size, dtype=torch.float32, device=device)
    lengths = torch.tensor([len(ids) for ids in token_id_lists], dtype=torch.long)
    flat = torch.tensor(list(itertools.chain.from_iterable(token_id_lists)), dtype=torch.long)
    row_ids = torch.repeat_interleave(torch.arange(num_rows), lengths)
    # Ids past the logits' vocabulary (an embedding larger than the LM head) cannot be
    # sampled, so they need no penalty: dropped, as Hugging Face does. Filtered on the
    # host copy; on CUDA an out-of-range index would be a device-side assert.
    in_range = (flat >= 0) & (flat < vocab_size)
    row_ids, flat = row_ids[in_range], flat[in_range]
    if flat.numel() == 0:
        return counts
    ones = torch.ones(flat.numel(), dtype=torch.float32, device=device)
    counts.index_put_((to_device(row_ids, device), to_device(flat, device)), ones, accumulate=True)
    return counts


def apply_penalties(
    logits: torch.Tensor,
    params: Sequence[SamplingParams],
    prompt_token_ids: Sequence[Sequence[int]],
    output_token_ids: Sequence[Sequence[int]],
) -> torch.Tensor:
    """Apply the three penalties to ``logits`` (float32 ``[num_rows, vocab_size]``) in place
    and return it. Only the rows that use a penalty are touched."""
    num_rows, vocab_size = logits.shape
    device = logits.device
    rep_rows = [i for i, p in enumerate(params) if p.repetition_penalty != 1.0]
    freq_rows = [
        i for i, p in enumerate(params) if p.presence_penalty != 0.0 or p.frequency_penalty != 0.0
    ]

    if rep_rows:
        # Prompt and output ids both count as "seen"; one scatter over their concatenation.
        seen_lists = [list(prompt_token_ids[i]) + list(output_token_ids[i]) for i in rep_rows]
        seen = token_counts(seen_lists, vocab_size, device) > 0
        rows = host_tensor(rep_rows, torch.long, device)
        penalty = host_tensor(
            [params[i].repetition_penalty for i in rep_rows], torch.float32, device
        )[:, None]
        sub = logits[rows]
        penalised = torch.where(sub > 0, sub / penalty, sub * penalty)
        logits[rows] = torch.where(seen, penalised, sub)

    if freq_rows:
        counts = token_counts([output_token_ids[i] for i in freq_rows], vocab_size, device)
        rows = host_tensor(freq_rows, torch.long, device)
        presence = host_tensor(
            [params[i].presence_penalty for i in freq_rows], torch.float32, device
        )[:, None]
        frequency = host_tensor(
            [params[i].frequency_penalty for i in freq_rows], torch.float32, device
        )[:, None]
        sub = logits[rows]
        sub -= presence * (counts > 0).to(torch.float32) + frequency * counts
        logits[rows] = sub
    return logits
