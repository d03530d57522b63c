"""``Sampler.plain_greedy``: only batches whose tokens are the raw logits' argmax qualify
(the decode graph's argmax is used for them), and ``greedy_sample`` gives those tokens."""

from __future__ import annotations

import pytest
import torch
from engine.model_executor.sampler import Sampler, SamplingBatch
from engine.sampling_params import SamplingParams


def _batch(params, outputs=None, masks=None) -> SamplingBatch:
    n = len(params)
    return SamplingBatch(
        params=params,
        generators=[None] * n,
        prompt_token_ids=[[1, 2, 3]] * n,
        output_token_ids=outputs if outputs is not None else [[4, 5]] * n,
        allowed_token_masks=masks,
    )


def test_plain_greedy_batch_takes_the_given_argmax() -> None:
    sampler = Sampler()
    params = [SamplingParams(temperature=0.0), SamplingParams(temperature=0.0, max_tokens=3)]
    batch = _batch(params)
    assert sampler.plain_greedy(batch)
    logits = torch.randn(2, 50, generator=torch.Generator().manual_seed(0))
    want = sampler(logits, batch).token_ids
    got = sampler.greedy_sample(logits.argmax(dim=-1), batch).to_host()
    assert got.token_ids == want and got.logprobs == [None, None]


@pytest.mark.parametrize(
    "params,outputs,masks",
    [
        ([SamplingParams(temperature=0.7)], None, None),
        ([SamplingParams(temperature=0.0, logprobs=1)], None, None),
        ([SamplingParams(temperature=0.0, repetition_penalty=1.2)], None, None),
        ([SamplingParams(temperature=0.0, presence_penalty=0.5)], None, None),
        ([SamplingParams(temperature=0.0, logit_bias={3: 5.0})], None, None),
        ([SamplingParams(temperature=0.0, min_tokens=5, eos_token_ids=[2])], [[4]], None),
        ([SamplingParams(temperature=0.0)], None, [torch.ones(50, dtype=torch.bool)]),
    ],
    ids=["random", "logprobs", "repetition", "presence", "bias", "min_tokens", "mask"],
)
def test_anything_that_changes_the_token_is_not_plain_greedy(params, outputs, masks) -> None:
    batch = _batch([SamplingParams(temperature=0.0), *params], outputs and [[4, 5], *outputs],
                   masks and [None, *masks])  # fmt: skip
    assert not Sampler().plain_greedy(batch)


def test_min_tokens_already_reached_is_plain_greedy() -> None:
    params = [SamplingParams(temperature=0.0, min_tokens=2, eos_token_ids=[2])]
    assert Sampler().plain_greedy(_batch(params, outputs=[[4, 5, 6]]))


@pytest.mark.parametrize(
    "params,plain",
    [
        (SamplingParams(temperature=0.8), True),
        (SamplingParams(temperature=1.0, top_k=0), True),
        (SamplingParams(temperature=1.0, top_k=20), False),
        (SamplingParams(temperature=1.0, top_p=0.9), False),
        (SamplingParams(temperature=1.0, min_p=0.1), False),
        (SamplingParams(temperature=1.0, logprobs=0), False),
        (SamplingParams(temperature=1.0, presence_penalty=0.5), False),
        (SamplingParams(temperature=1.0, seed=3), False),
    ],
    ids=["temperature", "top_k_off", "top_k", "top_p", "min_p", "logprobs", "penalty", "seed"],
)
def test_plain_rows_are_greedy_or_temperature_alone(params, plain) -> None:
    """The decode graph's own draw serves rows that scale by a temperature and nothing
    else; a seeded row needs its generator's draw, the others the sampler's stages."""
    batch = _batch([SamplingParams(temperature=0.0), params])
    if params.seed is not None:
        batch.generators[1] = torch.Generator().manual_seed(params.seed)
    assert Sampler().plain_rows(batch, vocab_size=50) == plain
    assert not Sampler().plain_greedy(batch)
