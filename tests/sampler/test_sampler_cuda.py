"""The sampler on a CUDA device: same answers as on CPU, seeds, and one host sync a call."""

from __future__ import annotations

import warnings

import pytest
import torch
from engine.model_executor.sampler import Sampler, SamplingBatch, compute_prompt_logprobs
from engine.sampling_params import SamplingParams

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
]

VOCAB_SIZE = 1000


def _batch(params, generators=None, outputs=None, masks=None) -> SamplingBatch:
    n = len(params)
    return SamplingBatch(
        params=params,
        generators=generators if generators is not None else [None] * n,
        prompt_token_ids=[[1, 2, 3, 900]] * n,
        output_token_ids=outputs if outputs is not None else [[5, 5, 6]] * n,
        allowed_token_masks=masks,
    )


def _mixed_params() -> list[SamplingParams]:
    return [
        SamplingParams(temperature=0.0, logprobs=5, repetition_penalty=1.3, logit_bias={42: 50}),
        SamplingParams(temperature=0.0, presence_penalty=0.5, frequency_penalty=0.3),
        SamplingParams(temperature=0.0, min_tokens=10, eos_token_ids=[7], logprobs=0),
        SamplingParams(temperature=0.9, top_k=20, top_p=0.9, min_p=0.05, logprobs=3),
        SamplingParams(temperature=1.2, seed=1),
    ]


def test_greedy_penalties_masks_and_logprobs_match_cpu() -> None:
    logits = torch.randn(5, VOCAB_SIZE, generator=torch.Generator().manual_seed(0)) * 3
    logits[2, 7] = 100.0  # EOS favoured but masked by min_tokens
    mask = torch.zeros(VOCAB_SIZE, dtype=torch.bool)
    mask[100:200] = True
    masks = [None, mask, None, mask, None]
    params = _mixed_params()
    cpu = Sampler()(logits, _batch(params, masks=masks))
    gpu = Sampler()(logits.cuda(), _batch(params, masks=masks))
    assert gpu.token_ids[:3] == cpu.token_ids[:3]
    assert gpu.token_ids[2] != 7
    assert gpu.token_ids[0] == 42  # logit_bias, added on the device
    assert 100 <= gpu.token_ids[1] < 200 and 100 <= gpu.token_ids[3] < 200
    for row in (0, 2):
        assert gpu.logprobs[row].rank == cpu.logprobs[row].rank
        assert gpu.logprobs[row].top_token_ids == cpu.logprobs[row].top_token_ids
        assert gpu.logprobs[row].logprob == pytest.approx(cpu.logprobs[row].logprob, abs=1e-5)
    prompt_cpu = compute_prompt_logprobs(logits, [1, 2, 3, 4, 5], 4)
    prompt_gpu = compute_prompt_logprobs(logits.cuda(), [1, 2, 3, 4, 5], 4)
    for a, b in zip(prompt_cpu, prompt_gpu, strict=True):
        assert (a.token_id, a.rank, a.top_token_ids) == (b.token_id, b.rank, b.top_token_ids)
        assert a.logprob == pytest.approx(b.logprob, abs=1e-5)


@pytest.mark.parametrize("generator_device", ["cuda", "cpu"])
def test_seeded_rows_reproduce_on_cuda(generator_device: str) -> None:
    row = torch.randn(1, VOCAB_SIZE, generator=torch.Generator().manual_seed(1)).cuda()
    params = SamplingParams(temperature=0.8, top_k=100, top_p=0.95)

    def run(others: int) -> list[int]:
        generator = torch.Generator(device=generator_device).manual_seed(11)
        tokens = []
        for _step in range(6):
            noise = torch.randn(others, VOCAB_SIZE, device="cuda")
            logits = torch.cat([noise, row])
            batch_params = [SamplingParams(top_p=0.5)] * others + [params]
            out = Sampler()(logits, _batch(batch_params, [None] * others + [generator]))
            tokens.append(out.token_ids[-1])
        return tokens

    assert run(0) == run(7) == run(3)


def test_sampling_frequencies_on_cuda() -> None:
    logits_row = torch.tensor([2.0, 1.5, 1.0, 0.5, 0.0, -0.5, -1.0, 0.8], device="cuda")
    num = 200_000
    torch.manual_seed(0)
    params = [SamplingParams(temperature=0.7, top_k=6)] * num
    out = Sampler()(logits_row.expand(num, -1).contiguous(), _batch(params, outputs=[[]] * num))
    freq = torch.bincount(torch.tensor(out.token_ids), minlength=8).double() / num
    scaled = (logits_row.cpu().double() / 0.7).clone()
    scaled[scaled < scaled.topk(6).values[-1]] = float("-inf")
    probs = scaled.softmax(-1)
    std = (probs * (1 - probs) / num).sqrt()
    assert torch.all((freq - probs).abs() <= 5 * std + 1e-9), (freq, probs)


def _count_syncs(fn) -> list[str]:
    fn()  # warm-up: lazy CUDA initialisation and first pinned allocations
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("warn")
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            fn()
    finally:
        torch.cuda.set_sync_debug_mode("default")
    return [str(w.message) for w in caught if "synchronizing" in str(w.message)]


@pytest.mark.parametrize("generator_device", ["cuda", "cpu"])
def test_sampling_queues_without_host_sync(generator_device: str) -> None:
    """Sampling only queues work: torch sees no synchronizing call while the step's
    sampling is enqueued (the one wait is ``DeviceSample.to_host``, on a CUDA event, which
    async scheduling defers to the next step)."""
    logits = torch.randn(5, VOCAB_SIZE, device="cuda")
    mask = torch.ones(VOCAB_SIZE, dtype=torch.bool)
    generator = torch.Generator(device=generator_device).manual_seed(1)
    batch = _batch(
        _mixed_params(),  # logit_bias, penalties, min_tokens, truncation, logprobs
        generators=[None] * 4 + [generator],
        masks=[None, None, mask, None, None],
    )
    assert _count_syncs(lambda: Sampler().sample_on_device(logits, batch)) == []
    plain = _batch([SamplingParams(temperature=0.5, top_k=3)] * 5)
    assert _count_syncs(lambda: Sampler().sample_on_device(logits, plain)) == []
    # The whole call (queue, then wait on the copy's event) still returns host values.
    out = Sampler()(logits, plain)
    assert len(out.token_ids) == 5 and all(isinstance(t, int) for t in out.token_ids)
    prompt = _count_syncs(lambda: compute_prompt_logprobs(logits, [1, 2, 3, 4, 5], 3))
    assert len(prompt) <= 1
