"""On the GPU (marked ``gpu``): the decode CUDA graphs, with the logits and each row's
token inside the graph for small batches, give the tokens of eager execution; plain
greedy batches take the graph's argmax, temperature-only rows the graph's draw, anything
else samples from the graph's logits."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from engine import LLM, SamplingParams
from engine.model_executor.cuda_graphs import LOGITS_IN_GRAPH_MAX_BATCH
from engine.model_executor.sampler import Sampler
from engine_sdk.testing.models import build_tiny_model

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA"),
]


@pytest.fixture(scope="module")
def tiny_qwen3(tmp_path_factory) -> Path:
    return build_tiny_model(tmp_path_factory.mktemp("qwen3"), "Qwen3ForCausalLM")


def _prompts(n: int) -> list[dict[str, list[int]]]:
    return [
        {"prompt_token_ids": [(5 * i + 3 * j) % 300 + 1 for j in range(4 + i)]} for i in range(n)
    ]


def _count_graph_tokens(monkeypatch) -> list[int]:
    """The batch sizes of the steps that took the graph's own tokens, as they run."""
    calls: list[int] = []
    original = Sampler.greedy_sample

    def counting(self, token_ids, batch):
        calls.append(len(batch))
        return original(self, token_ids, batch)

    monkeypatch.setattr(Sampler, "greedy_sample", counting)
    return calls


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_graph_decode_matches_eager(tiny_qwen3: Path, dtype: str, monkeypatch) -> None:
    base = {"device": "cuda", "dtype": dtype, "kv_cache_memory_bytes": 1 << 28}
    eager = LLM(str(tiny_qwen3), enforce_eager=True, **base)
    graphs = LLM(str(tiny_qwen3), **base)
    assert graphs.engine.engine_core.runner.cuda_graphs is not None
    greedy_calls = _count_graph_tokens(monkeypatch)
    cases = {
        "greedy": SamplingParams(temperature=0.0, max_tokens=24, ignore_eos=True),
        "penalty": SamplingParams(
            temperature=0.0, repetition_penalty=1.3, max_tokens=16, ignore_eos=True
        ),
        "logprobs": SamplingParams(temperature=0.0, logprobs=3, max_tokens=8, ignore_eos=True),
        "seeded": SamplingParams(temperature=0.9, seed=5, top_k=20, max_tokens=16, ignore_eos=True),
    }
    for batch in (1, 3, LOGITS_IN_GRAPH_MAX_BATCH + 4):
        for name, params in cases.items():
            greedy_calls.clear()
            want = eager.generate(_prompts(batch), params, use_tqdm=False)
            assert not greedy_calls  # eager steps never take a graph's argmax
            got = graphs.generate(_prompts(batch), params, use_tqdm=False)
            for w, g in zip(want, got, strict=True):
                assert g.outputs[0].token_ids == w.outputs[0].token_ids, (name, batch)
            if name == "logprobs":
                for w, g in zip(want, got, strict=True):
                    for lw, lg in zip(w.outputs[0].logprobs, g.outputs[0].logprobs, strict=True):
                        assert lg.token_id == lw.token_id and lg.rank == lw.rank
                        tol = 1e-4 if dtype == "float32" else 3e-2  # bf16 logits rounding
                        if dtype == "float32":  # bf16 rounding can swap near-tied runners-up
                            assert lg.top_token_ids == lw.top_token_ids
                        assert lg.logprob == pytest.approx(lw.logprob, abs=tol)
            plain = name == "greedy" and batch <= LOGITS_IN_GRAPH_MAX_BATCH
            assert bool(greedy_calls) == plain, (name, batch, greedy_calls)


def test_graph_samples_temperature_rows(tiny_qwen3: Path, monkeypatch) -> None:
    """Rows that only scale by a temperature take the graph's own draw at small batches
    (one launch: no sampler kernels); the draws vary between requests and runs, and a
    batch that mixes them with greedy rows keeps the greedy rows' tokens exact."""
    base = {"device": "cuda", "dtype": "float32", "kv_cache_memory_bytes": 1 << 28}
    eager = LLM(str(tiny_qwen3), enforce_eager=True, **base)
    graphs = LLM(str(tiny_qwen3), **base)
    calls = _count_graph_tokens(monkeypatch)
    warm = SamplingParams(temperature=1.0, max_tokens=24, ignore_eos=True)
    greedy = SamplingParams(temperature=0.0, max_tokens=24, ignore_eos=True)
    prompts = _prompts(4)
    first = graphs.generate(prompts, [warm, greedy, warm, greedy], use_tqdm=False)
    assert calls and max(calls) == 4  # the graph's tokens, for the whole mixed batch
    second = graphs.generate(prompts, [warm, greedy, warm, greedy], use_tqdm=False)
    want = eager.generate(prompts, greedy, use_tqdm=False)
    for i in (1, 3):  # greedy rows: exactly the eager argmax
        assert first[i].outputs[0].token_ids == want[i].outputs[0].token_ids
        assert second[i].outputs[0].token_ids == want[i].outputs[0].token_ids
    draws = [first[0], first[2], second[0], second[2]]
    assert len({tuple(d.outputs[0].token_ids) for d in draws}) == 4  # fresh noise each
    top_p = SamplingParams(temperature=1.0, top_p=0.9, max_tokens=4, ignore_eos=True)
    calls.clear()
    graphs.generate(prompts[:1], top_p, use_tqdm=False)
    assert not calls  # top-p is not plain: the sampler draws from the graph's logits
