"""Sampler end to end on CPU: greedy, seeds, masks, and sampling frequencies."""

from __future__ import annotations

import pytest
import torch
from engine.model_executor.sampler import Sampler, SamplingBatch
from engine.sampling_params import SamplingParams
from transformers.generation.logits_process import (
    MinPLogitsWarper,
    TemperatureLogitsWarper,
    TopKLogitsWarper,
    TopPLogitsWarper,
)

VOCAB_SIZE = 300


def _batch(
    params: list[SamplingParams],
    generators: list[torch.Generator | None] | None = None,
    outputs: list[list[int]] | None = None,
    masks: list[torch.Tensor | None] | None = None,
) -> SamplingBatch:
    n = len(params)
    return SamplingBatch(
        params=params,
        generators=generators if generators is not None else [None] * n,
        prompt_token_ids=[[1, 2, 3]] * n,
        output_token_ids=outputs if outputs is not None else [[]] * n,
        allowed_token_masks=masks,
    )


def _seeded(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def _logits(num_rows: int, seed: int, vocab_size: int = VOCAB_SIZE) -> torch.Tensor:
    return torch.randn(num_rows, vocab_size, generator=_seeded(seed)) * 2


def test_greedy_is_exactly_argmax_with_lowest_index_on_ties() -> None:
    logits = _logits(4, 0)
    logits[2, 10] = logits[2, 250] = 100.0  # tie: the lower id wins
    params = [SamplingParams(temperature=0.0)] * 4
    out = Sampler()(logits, _batch(params))
    assert out.token_ids == logits.argmax(-1).tolist()
    assert out.token_ids[2] == 10
    assert out.logprobs == [None] * 4


def test_greedy_applies_penalties_first() -> None:
    logits = torch.zeros(1, VOCAB_SIZE)
    logits[0, 5] = 2.0
    logits[0, 6] = 1.5
    # Token 5 was generated: frequency 1.0 -> 1.0 < 1.5, so 6 wins.
    params = [SamplingParams(temperature=0.0, frequency_penalty=1.0)]
    out = Sampler()(logits, _batch(params, outputs=[[5]]))
    assert out.token_ids == [6]


def test_mixed_greedy_and_random_rows() -> None:
    logits = _logits(6, 1)
    params = [SamplingParams(temperature=0.0 if i % 2 == 0 else 1.0) for i in range(6)]
    argmax = logits.argmax(-1).tolist()
    random_hits = 0
    for step in range(10):
        torch.manual_seed(step)
        out = Sampler()(logits, _batch(params))
        assert [out.token_ids[i] for i in (0, 2, 4)] == [argmax[i] for i in (0, 2, 4)]
        random_hits += sum(out.token_ids[i] != argmax[i] for i in (1, 3, 5))
    assert random_hits > 0  # temperature 1 over 300 tokens is not argmax every time


def test_caller_logits_are_not_modified() -> None:
    logits = _logits(2, 2)
    original = logits.clone()
    params = [
        SamplingParams(repetition_penalty=1.5, min_tokens=2, eos_token_ids=[0], top_p=0.5),
        SamplingParams(temperature=0.5, top_k=3, min_p=0.1),
    ]
    mask = torch.zeros(VOCAB_SIZE, dtype=torch.bool)
    mask[:50] = True
    Sampler()(logits, _batch(params, masks=[None, mask]))
    assert torch.equal(logits, original)


def _run_seeded_row(logits_row: torch.Tensor, params: SamplingParams, seed: int, others: int):
    """Sample 5 steps of one seeded row, alone or amid ``others`` unseeded/seeded rows."""
    generator = _seeded(seed)
    tokens = []
    for step in range(5):
        rows = [logits_row[None]]
        batch_params = [params]
        generators: list[torch.Generator | None] = [generator]
        for j in range(others):
            rows.append(_logits(1, 100 + step * 10 + j))
            batch_params.append(SamplingParams(temperature=0.7, top_p=0.9, top_k=20))
            generators.append(_seeded(999 + j) if j % 2 else None)
        # The seeded row sits in the middle of the batch when there are others.
        order = list(range(1, len(rows))) + [0] if others else [0]
        logits = torch.cat([rows[i] for i in order])
        out = Sampler()(
            logits,
            _batch([batch_params[i] for i in order], [generators[i] for i in order]),
        )
        tokens.append(out.token_ids[order.index(0)])
    return tokens


@pytest.mark.parametrize(
    "params",
    [
        SamplingParams(temperature=1.0),
        SamplingParams(temperature=0.8, top_k=50, top_p=0.95, min_p=0.01),
    ],
)
def test_seeded_row_reproduces_regardless_of_batch(params: SamplingParams) -> None:
    row = _logits(1, 3)[0] * 0.3  # flat enough that the seed matters
    alone = _run_seeded_row(row, params, seed=42, others=0)
    torch.manual_seed(7)
    crowded = _run_seeded_row(row, params, seed=42, others=5)
    torch.manual_seed(8)
    crowded_again = _run_seeded_row(row, params, seed=42, others=3)
    assert alone == crowded == crowded_again
    assert _run_seeded_row(row, params, seed=43, others=0) != alone


def test_rows_with_different_seeds_differ() -> None:
    logits = torch.zeros(8, VOCAB_SIZE)  # uniform: every row is a fresh draw
    params = [SamplingParams(seed=100 + i) for i in range(8)]
    generators: list[torch.Generator | None] = [_seeded(100 + i) for i in range(8)]
    sequences = [[] for _ in range(8)]
    for _ in range(4):
        out = Sampler()(logits, _batch(params, generators))
        for i, token in enumerate(out.token_ids):
            sequences[i].append(token)
    assert len({tuple(s) for s in sequences}) == 8


def test_min_tokens_masks_eos_and_stop_ids_until_reached() -> None:
    logits = torch.zeros(3, VOCAB_SIZE)
    logits[:, 7] = 10.0  # EOS is the clear favourite
    logits[:, 8] = 9.0  # then a stop token
    logits[:, 9] = 8.0
    params = [
        SamplingParams(temperature=0.0, min_tokens=3, eos_token_ids=[7], stop_token_ids=[8]),
        SamplingParams(
            temperature=0.0, min_tokens=3, eos_token_ids=[7], stop_token_ids=[8], ignore_eos=True
        ),
        SamplingParams(temperature=0.0, min_tokens=2, eos_token_ids=[7], stop_token_ids=[8]),
    ]
    outputs = [[1, 1], [1, 1], [1, 1]]  # rows 0, 1 still short; row 2 has reached 2
    out = Sampler()(logits, _batch(params, outputs=outputs))
    assert out.token_ids == [9, 9, 7]
    # Random rows too: EOS is never drawn while masked.
    random_params = [SamplingParams(min_tokens=5, eos_token_ids=[7, 299], stop_token_ids=[8])] * 50
    out = Sampler()(torch.zeros(50, VOCAB_SIZE), _batch(random_params, outputs=[[]] * 50))
    assert not {7, 8, 299} & set(out.token_ids)


def test_allowed_token_masks_are_never_violated() -> None:
    gen = _seeded(5)
    num_rows = 16
    masks: list[torch.Tensor | None] = []
    for i in range(num_rows):
        if i % 4 == 3:
            masks.append(None)
            continue
        mask = torch.rand(VOCAB_SIZE, generator=gen) < 0.05
        mask[i] = True  # at least one allowed token
        masks.append(mask)
    masks[0] = torch.zeros(VOCAB_SIZE - 100, dtype=torch.bool)  # shorter than the vocab
    masks[0][3] = masks[0][150] = True
    params = [
        SamplingParams(temperature=0.0 if i % 5 == 0 else 1.3, top_k=i % 3 * 10)
        for i in range(num_rows)
    ]
    for step in range(30):
        logits = _logits(num_rows, 1000 + step)
        logits[:, VOCAB_SIZE - 1] = 50.0  # tempting, and outside row 0's short mask
        out = Sampler()(logits, _batch(params, masks=masks))
        for i, token in enumerate(out.token_ids):
            mask = masks[i]
            if mask is not None:
                assert token < mask.shape[0] and bool(mask[token]), (step, i, token)
            if params[i].greedy and mask is not None:
                allowed = torch.full((VOCAB_SIZE,), float("-inf"))
                allowed[: mask.shape[0]] = torch.where(mask, 0.0, float("-inf"))
                assert token == int((logits[i] + allowed).argmax())


def _sampling_frequencies(logits_row: torch.Tensor, params: SamplingParams, num: int):
    torch.manual_seed(1234)
    out = Sampler()(logits_row.expand(num, -1).contiguous(), _batch([params] * num))
    counts = torch.bincount(torch.tensor(out.token_ids), minlength=logits_row.shape[0])
    return counts.double() / num


def _assert_frequencies_match(freq: torch.Tensor, probs: torch.Tensor, num: int) -> None:
    # 5 standard deviations per token; exact zeros where the probability is zero.
    std = (probs * (1 - probs) / num).sqrt()
    assert torch.all((freq - probs).abs() <= 5 * std + 1e-9), (freq, probs)
    assert torch.all(freq[probs == 0] == 0)


@pytest.mark.parametrize(
    "params",
    [
        SamplingParams(temperature=1.0),
        SamplingParams(temperature=0.6),
        SamplingParams(temperature=1.5, top_k=4),
        SamplingParams(temperature=1.0, top_p=0.8),
        SamplingParams(temperature=0.9, top_k=6, top_p=0.9, min_p=0.1),
    ],
)
def test_sampling_frequencies_match_probabilities(params: SamplingParams) -> None:
    logits_row = torch.tensor([2.0, 1.5, 1.0, 0.5, 0.0, -0.5, -1.0, 0.8])
    num = 40_000
    freq = _sampling_frequencies(logits_row, params, num)
    scores = TemperatureLogitsWarper(params.temperature)(None, logits_row[None])
    if params.top_k:
        scores = TopKLogitsWarper(params.top_k)(None, scores)
    if params.top_p < 1:
        scores = TopPLogitsWarper(params.top_p)(None, scores)
    if params.min_p > 0:
        scores = MinPLogitsWarper(params.min_p)(None, scores)
    probs = scores[0].double().softmax(-1)
    _assert_frequencies_match(freq, probs, num)


def test_seeded_generator_samples_with_the_right_frequencies() -> None:
    logits_row = torch.tensor([[1.0, 0.0, -1.0, 0.5, 2.0]])
    params = SamplingParams(seed=3)
    generator = _seeded(3)
    num = 3000
    tokens = [Sampler()(logits_row, _batch([params], [generator])).token_ids[0] for _ in range(num)]
    freq = torch.bincount(torch.tensor(tokens), minlength=5).double() / num
    _assert_frequencies_match(freq, logits_row[0].double().softmax(-1), num)


def test_bad_batches_raise_clear_errors() -> None:
    params = [SamplingParams()] * 2
    with pytest.raises(ValueError, match="generators"):
        SamplingBatch(params, [None], [[1], [1]], [[], []])
    with pytest.raises(ValueError, match="num_rows"):
        Sampler()(torch.zeros(3, VOCAB_SIZE), _batch(params))
    with pytest.raises(ValueError, match="allowed_token_masks\\[1\\]"):
        masks = [None, torch.ones(VOCAB_SIZE + 1, dtype=torch.bool)]
        Sampler()(torch.zeros(2, VOCAB_SIZE), _batch(params, masks=masks))
    with pytest.raises(ValueError, match="bool"):
        masks = [torch.ones(VOCAB_SIZE), None]
        Sampler()(torch.zeros(2, VOCAB_SIZE), _batch(params, masks=masks))


def test_non_contiguous_logits_give_the_same_tokens() -> None:
    base = _logits(VOCAB_SIZE, 9, vocab_size=4)  # [V, 4] -> transposed view [4, V]
    logits_copy = base.t().contiguous()
    logits_copy[:, 0] = logits_copy.max() + 1  # EOS favoured, masked by min_tokens
    params = [SamplingParams(temperature=0.0, min_tokens=1, eos_token_ids=[0], logprobs=1)] * 4
    transposed = logits_copy.t().contiguous().t()
    assert not transposed.is_contiguous()
    for view in (logits_copy, transposed):
        out = Sampler()(view, _batch(params))
        expected = logits_copy[:, 1:].argmax(-1) + 1
        assert out.token_ids == expected.tolist()
