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
