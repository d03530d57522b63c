"""Penalties against a hand-written per-token loop and Hugging Face's processor."""

from __future__ import annotations

import torch
from engine.model_executor.penalties import apply_penalties, token_counts
from engine.sampling_params import SamplingParams
from transformers.generation.logits_process import RepetitionPenaltyLogitsProcessor

VOCAB_SIZE = 40


def _reference(
    logits: torch.Tensor,
    params: list[SamplingParams],
    prompts: list[list[int]],
    outputs: list[list[int]],
) -> torch.Tensor:
    """The definitions, one token at a time, in float64."""
    result = logits.double().clone()
    for row, p in enumerate(params):
        seen = set(prompts[row]) | set(outputs[row])
        for token in range(logits.shape[1]):
            value = result[row, token].item()
            if token in seen:
                if value > 0:
                    value = value / p.repetition_penalty
                else:
                    value = value * p.repetition_penalty
            count = outputs[row].count(token)
            value -= p.presence_penalty * (1.0 if count > 0 else 0.0)
            value -= p.frequency_penalty * count
            result[row, token] = value
    return result


def test_penalties_match_the_per_token_definition() -> None:
    gen = torch.Generator().manual_seed(0)
    logits = torch.randn(5, VOCAB_SIZE, generator=gen) * 3
    params = [
        SamplingParams(repetition_penalty=1.3),
        SamplingParams(presence_penalty=0.7),
        SamplingParams(frequency_penalty=0.4, repetition_penalty=0.8),
        SamplingParams(presence_penalty=-1.0, frequency_penalty=1.5, repetition_penalty=1.9),
        SamplingParams(),  # no penalty: must stay bit for bit
    ]
    prompts = [[1, 2, 3, 3], [4, 5], [6, 7, 7], [0, 39], [1, 2]]
    outputs = [[8, 8, 9], [5, 5, 5, 10], [7, 11], [], [3, 3]]
    expected = _reference(logits, params, prompts, outputs)
    actual = apply_penalties(logits.clone(), params, prompts, outputs)
    torch.testing.assert_close(actual.double(), expected, rtol=1e-6, atol=1e-6)
    assert torch.equal(actual[4], logits[4])
    # Presence/frequency look at the OUTPUT only: row 1's prompt token 4 is untouched.
    assert actual[1, 4] == logits[1, 4]
    assert actual[1, 5] == logits[1, 5] - 0.7


def test_repetition_penalty_matches_hugging_face() -> None:
    gen = torch.Generator().manual_seed(1)
    logits = torch.randn(3, VOCAB_SIZE, generator=gen) * 2
    sequences = [[3, 4, 5, 30, 31], [0, 0, 1, 2, 39], [7, 8, 9, 10, 11]]
    for penalty in (0.5, 1.2, 2.0):
        params = [SamplingParams(repetition_penalty=penalty)] * 3
        hf = RepetitionPenaltyLogitsProcessor(penalty)(torch.tensor(sequences), logits.clone())
        # Split each sequence into prompt and output anywhere: both count as "seen".
        prompts = [s[:2] for s in sequences]
        outputs = [s[2:] for s in sequences]
        ours = apply_penalties(logits.clone(), params, prompts, outputs)
        assert torch.equal(ours, hf)


def test_token_counts_counts_repeats_and_drops_out_of_range_ids() -> None:
    rows = [([5, 7], [5]), ((),), ([2, 99], [-1])]  # row 0: prompt + output lists
    counts = token_counts(rows, 10, torch.device("cpu"))
    expected = torch.zeros(3, 10)
    expected[0, 5] = 2
    expected[0, 7] = 1
    expected[2, 2] = 1
    assert torch.equal(counts, expected)


def test_unpenalised_batch_leaves_logits_identical() -> None:
    logits = torch.randn(2, VOCAB_SIZE)
    params = [SamplingParams(), SamplingParams(repetition_penalty=1.5)]
    out = apply_penalties(logits.clone(), params, [[1], [1]], [[2], []])
    assert torch.equal(out[0], logits[0])
    assert not torch.equal(out[1], logits[1])


def test_all_rows_and_some_rows_penalised_agree() -> None:
    logits = torch.randn(4, VOCAB_SIZE, generator=torch.Generator().manual_seed(2))
    params = [SamplingParams(repetition_penalty=1.4, frequency_penalty=0.3)] * 4
    prompts, outputs = [[1, 2]] * 4, [[2, 3, 3], [4], [], [39, 0]]
    together = apply_penalties(logits.clone(), params, prompts, outputs)
    mixed_params = [*params[:2], SamplingParams(), *params[2:]]
    mixed_logits = torch.cat([logits[:2], torch.zeros(1, VOCAB_SIZE), logits[2:]])
    mixed = apply_penalties(
        mixed_logits,
        mixed_params,
        [*prompts[:2], [9], *prompts[2:]],
        [*outputs[:2], [5], *outputs[2:]],
    )
    assert torch.equal(mixed[[0, 1, 3, 4]], together)
    assert torch.equal(mixed[2], torch.zeros(VOCAB_SIZE))
