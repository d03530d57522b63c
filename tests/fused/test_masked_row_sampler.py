"""The sampler's one-launch path for structured outputs: temperature-only rows under
packed masks go to ``RowSampler`` with the masks (``ENGINE_MASKED_ROW_SAMPLER``; on a CPU
``force`` runs it through Triton's interpreter); anything else the pipeline keeps."""

from __future__ import annotations

import pytest
import torch
from engine.model_executor.sampler import Sampler, SamplingBatch
from engine.sampling_params import SamplingParams
from engine.structured_output.masks import PackedMasks, forbidden_bits_table
from engine_sdk.layers.sampling import RowSampler
from test_row_sampler import _packed

DEVICE = torch.device("cuda" if torch.cuda.is_available() else "cpu")
VOCAB = 5000  # two chunks of the row sampler, the second partial


def _masks(allowed: torch.Tensor) -> PackedMasks:
    bits = _packed(allowed)
    return PackedMasks(bits.to(DEVICE), forbidden_bits_table(DEVICE), allowed.shape[1])


@pytest.fixture
def launches(monkeypatch):
    monkeypatch.setenv("ENGINE_MASKED_ROW_SAMPLER", "force")
    calls = []
    real = RowSampler.__call__

    def counting(self, *args, **kwargs):
        calls.append(kwargs.get("allowed_bits", args[2] if len(args) > 2 else None))
        return real(self, *args, **kwargs)

    monkeypatch.setattr(RowSampler, "__call__", counting)
    return calls


def _batch(params: list[SamplingParams], masks: PackedMasks) -> SamplingBatch:
    n = len(params)
    return SamplingBatch(params, [None] * n, [[]] * n, [[]] * n, allowed_token_masks=masks)


def _case(seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    logits = torch.randn(4, VOCAB, generator=gen) * 3
    allowed = torch.rand(4, VOCAB, generator=gen) < 0.01
    allowed[:, 4999] = True  # the last id, in the partial chunk
    logits[:, 4998] = 100.0  # every row's maximum, forbidden
    return logits.to(DEVICE), allowed


def test_temperature_rows_under_masks_take_one_launch(launches, monkeypatch):
    logits, allowed = _case(0)
    masks = _masks(allowed)
    params = [SamplingParams(temperature=t) for t in (0.0, 1.0, 0.7, 0.0)]
    sampler = Sampler()
    got = sampler(logits, _batch(params, masks)).token_ids
    assert len(launches) == 1 and launches[0] is masks.bits  # the masks in the launch
    assert all(bool(allowed[i, t]) for i, t in enumerate(got))
    # the greedy rows are the pipeline's (the masked argmax)
    monkeypatch.setenv("ENGINE_MASKED_ROW_SAMPLER", "0")
    want = sampler(logits, _batch(params, masks)).token_ids
    assert len(launches) == 1  # switched off: the pipeline
    assert [got[0], got[3]] == [want[0], want[3]]
    masked = logits.masked_fill(~allowed.to(DEVICE), float("-inf"))
    assert got[0] == int(masked[0].argmax())


@pytest.mark.parametrize(
    "extra",
    [
        {"top_k": 5},
        {"top_p": 0.9},
        {"min_p": 0.1},
        {"logprobs": 2},
        {"presence_penalty": 0.5},
        {"logit_bias": {1: 1.0}},
        {"seed": 3},
        {"min_tokens": 4, "stop_token_ids": [4999]},
    ],
    ids=lambda e: next(iter(e)),
)
def test_anything_else_keeps_the_pipeline(launches, extra):
    logits, allowed = _case(1)
    params = [SamplingParams(temperature=1.0), SamplingParams(temperature=0.5, **extra)]
    generators = [None, torch.Generator(device=DEVICE).manual_seed(3) if "seed" in extra else None]
    batch = SamplingBatch(
        params, generators, [[1]] * 2, [[]] * 2, allowed_token_masks=_masks(allowed[:2])
    )
    got = Sampler()(logits[:2], batch).token_ids
    assert launches == []
    assert all(bool(allowed[i, t]) for i, t in enumerate(got))


def test_the_sampler_grows_its_row_buffers(launches):
    sampler = Sampler()
    for rows in (4, 70, 3):
        gen = torch.Generator().manual_seed(rows)
        logits = torch.randn(rows, VOCAB, generator=gen).to(DEVICE)
        allowed = torch.zeros(rows, VOCAB, dtype=torch.bool)
        allowed[:, rows] = True  # one allowed id: every row must draw it
        params = [SamplingParams(temperature=1.0)] * rows
        assert sampler(logits, _batch(params, _masks(allowed))).token_ids == [rows] * rows
    assert len(launches) == 3
    (row_sampler,) = sampler._row_samplers.values()
    assert row_sampler.max_rows >= 70


@pytest.mark.skipif(DEVICE.type == "cuda", reason="the default on CPU logits")
def test_cpu_logits_keep_the_pipeline_unless_forced(monkeypatch):
    monkeypatch.setenv("ENGINE_MASKED_ROW_SAMPLER", "1")
    logits, allowed = _case(2)
    params = [SamplingParams(temperature=1.0)] * 4
    sampler = Sampler()
    got = sampler(logits, _batch(params, _masks(allowed))).token_ids
    assert all(bool(allowed[i, t]) for i, t in enumerate(got))
    assert not sampler._row_samplers
