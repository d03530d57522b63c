"""Sampled-token and prompt logprobs against torch.log_softmax and hand-counted ranks."""

from __future__ import annotations

import pytest
import torch
from engine.model_executor.sampler import (
    Sampler,
    SamplingBatch,
    compute_prompt_logprobs,
)
from engine.sampling_params import SamplingParams

VOCAB_SIZE = 500


def _batch(params: list[SamplingParams], outputs: list[list[int]] | None = None) -> SamplingBatch:
    n = len(params)
    return SamplingBatch(
        params=params,
        generators=[None] * n,
        prompt_token_ids=[[4, 5, 6]] * n,
        output_token_ids=outputs if outputs is not None else [[]] * n,
    )


def _check(entry, logits_row: torch.Tensor, token_id: int, num_top: int) -> None:
    reference = logits_row.float().log_softmax(-1)
    assert entry.token_id == token_id
    assert entry.logprob == reference[token_id].item()  # exact: same float32 op
    assert entry.rank == 1 + sum(1 for v in reference.tolist() if v > reference[token_id])
    order = sorted(range(len(reference)), key=lambda i: -reference[i].item())
    assert entry.top_token_ids == order[:num_top]
    assert entry.top_logprobs == [reference[i].item() for i in order[:num_top]]


def test_sampled_logprobs_values_ranks_and_top_k() -> None:
    logits = torch.randn(5, VOCAB_SIZE, generator=torch.Generator().manual_seed(0)) * 3
    params = [
        SamplingParams(temperature=0.0, logprobs=5),
        SamplingParams(temperature=1.0, logprobs=0),  # chosen token only
        SamplingParams(temperature=1.0),  # none
        SamplingParams(temperature=0.7, top_k=40, logprobs=20),
        SamplingParams(temperature=2.0, logprobs=3),
    ]
    torch.manual_seed(0)
    out = Sampler()(logits, _batch(params))
    assert out.logprobs[2] is None
    for row, num_top in ((0, 5), (1, 0), (3, 20), (4, 3)):
        entry = out.logprobs[row]
        assert entry is not None
        _check(entry, logits[row], out.token_ids[row], num_top)
    assert out.logprobs[0].rank == 1  # greedy without penalties picks the best token
    assert out.logprobs[1].top_token_ids == [] and out.logprobs[1].top_logprobs == []


def test_logprobs_are_of_the_raw_logits_not_the_processed_ones() -> None:
    logits = torch.zeros(1, VOCAB_SIZE)
    logits[0, 10] = 5.0
    logits[0, 11] = 4.0
    # The penalty turns 10 into 5/2 = 2.5 < 4, so greedy picks 11, reported with its raw
    # logprob and raw rank 2; temperature 0 must not sharpen the reported numbers either.
    params = [SamplingParams(temperature=0.0, repetition_penalty=2.0, logprobs=2)]
    out = Sampler()(logits, _batch(params, outputs=[[10]]))
    assert out.token_ids == [11]
    entry = out.logprobs[0]
    _check(entry, logits[0], 11, 2)
    assert entry.rank == 2
    assert entry.top_token_ids == [10, 11]


def test_rank_ties_share_the_better_rank() -> None:
    logits = torch.zeros(1, VOCAB_SIZE)
    logits[0, 3] = logits[0, 4] = 1.0
    out = Sampler()(logits, _batch([SamplingParams(temperature=0.0, logprobs=1)]))
    assert out.token_ids == [3]
    assert out.logprobs[0].rank == 1


def test_prompt_logprobs_per_position() -> None:
    logits = torch.randn(6, VOCAB_SIZE, generator=torch.Generator().manual_seed(1))
    targets = [0, 17, 499, 250, 3, 3]
    for num_top in (0, 1, 7):
        entries = compute_prompt_logprobs(logits, targets, num_top)
        assert len(entries) == 6
        for row, entry in enumerate(entries):
            _check(entry, logits[row], targets[row], num_top)


def test_prompt_logprobs_accepts_bf16_and_empty_inputs() -> None:
    logits = torch.randn(2, VOCAB_SIZE).to(torch.bfloat16)
    entries = compute_prompt_logprobs(logits, [1, 2], 2)
    _check(entries[1], logits[1], 2, 2)
    assert compute_prompt_logprobs(torch.zeros(0, VOCAB_SIZE), [], 3) == []


def test_prompt_logprobs_errors_name_the_problem() -> None:
    with pytest.raises(ValueError, match="one target per row"):
        compute_prompt_logprobs(torch.zeros(2, VOCAB_SIZE), [1], 0)
    with pytest.raises(ValueError, match="vocabulary"):
        compute_prompt_logprobs(torch.zeros(1, VOCAB_SIZE), [VOCAB_SIZE], 0)
