"""Tensor parallelism end to end on the CPU (gloo): ``LLM(tensor_parallel_size=2)`` starts
two worker processes whose greedy tokens and logprobs match ``tensor_parallel_size=1``,
under chunked prefill and preemption; each rank holds about half the weights; deleting
the ``LLM`` leaves no worker process behind."""

from __future__ import annotations

import gc
from pathlib import Path
from typing import Any

import pytest
from engine import LLM, SamplingParams
from engine_sdk.testing.models import build_tiny_model
from tp_helpers import BASE, pid_alive, wait_gone

PROMPTS = [
    "Hello world! How are you today?",
    "The quick brown fox jumps over the lazy dog. A journey of a thousand miles",
    "Café 東京 😀",
    "A",
    "Numbers: 0 1 2 3 4 5 6 7 8 9 10 42 100 2024",
    "Paris is the capital of France, and Berlin is",
]
NUM_NEW = 12
# Small steps and a small cache: prompts are chunked and requests preempted under TP=2.
TIGHT = {"max_model_len": 64, "max_num_seqs": 8, "max_num_batched_tokens": 16}
TP2_KV_BYTES = 20 * 1024  # 20 blocks of 1 KV head per rank (2 layers x K,V x 4 x 16 x 4 B)

CASES: dict[str, tuple[str, dict[str, Any]]] = {
    # 4 query heads, 2 KV heads: each rank holds 2 query heads and 1 KV head.
    "qwen3-kv-split": ("Qwen3ForCausalLM", {}),
    # tied head over the vocabulary-parallel embedding, biases on every projection, a
    # vocabulary (397) that does not divide by 2 (the last shard is padded).
    "llama-tied-bias-odd-vocab": (
        "LlamaForCausalLM",
        {
            "tie_word_embeddings": True,
            "attention_bias": True,
            "mlp_bias": True,
            "vocab_size": 397,
        },
    ),
    # 1 KV head: replicated on both ranks.
    "qwen3-kv-replicated": ("Qwen3ForCausalLM", {"num_key_value_heads": 1}),
}


def _params() -> list[SamplingParams]:
    greedy = SamplingParams(temperature=0.0, max_tokens=NUM_NEW, ignore_eos=True)
    with_logprobs = greedy.clone(logprobs=3, prompt_logprobs=2)
    return [with_logprobs] + [greedy] * (len(PROMPTS) - 1)


def _run(llm: LLM) -> list[Any]:
    return llm.generate(PROMPTS, _params(), use_tqdm=False)


def _assert_close(want: list[Any], have: list[Any]) -> None:
    assert len(want) == len(have)
    for w, h in zip(want, have, strict=True):
        assert (h.token_id, h.rank) == (w.token_id, w.rank)
        assert h.logprob == pytest.approx(w.logprob, abs=1e-4)
        assert h.top_token_ids == w.top_token_ids
        assert h.top_logprobs == pytest.approx(w.top_logprobs, abs=1e-4)


def _model_dir(tmp_path_factory: pytest.TempPathFactory, case: str) -> Path:
    arch, overrides = CASES[case]
    return build_tiny_model(tmp_path_factory.mktemp(case), arch, **overrides)


@pytest.mark.timeout(600)
@pytest.mark.parametrize("case", list(CASES))
def test_tp2_greedy_matches_tp1(tmp_path_factory: pytest.TempPathFactory, case: str) -> None:
    path = str(_model_dir(tmp_path_factory, case))
    tp1 = LLM(model=path, kv_cache_memory_bytes=1 << 20, **BASE, **TIGHT)
    expected = _run(tp1)
    full_weights = tp1.engine.runner.weights_bytes
    assert len({tuple(o.outputs[0].token_ids) for o in expected}) > 1
    del tp1

    llm = LLM(
        model=path, tensor_parallel_size=2, kv_cache_memory_bytes=TP2_KV_BYTES, **BASE, **TIGHT
    )
    executor = llm.engine.runner
    pids = [p for p in executor.worker_pids if p is not None]
    assert len(pids) == 2 and all(pid_alive(p) for p in pids)
    assert executor.num_blocks_per_rank == [20, 20] and executor.num_blocks == 20
    # every rank holds its shards only: about half the weights (norms are replicated)
    for rank_bytes in executor.weights_bytes_per_rank:
        assert 0.45 * full_weights < rank_bytes < 0.6 * full_weights

    got = _run(llm)
    assert llm.stats().num_preemptions > 0, "the cache was meant to be too small for all"
    assert [o.outputs[0].token_ids for o in got] == [o.outputs[0].token_ids for o in expected]
    # logprobs of the sampled tokens and of the prompt agree to float32 rounding
    want_lps, have_lps = expected[0].outputs[0].logprobs, got[0].outputs[0].logprobs
    assert want_lps is not None and have_lps is not None and len(want_lps) == NUM_NEW
    _assert_close(want_lps, have_lps)
    want_prompt, have_prompt = expected[0].prompt_logprobs, got[0].prompt_logprobs
    assert want_prompt is not None and have_prompt is not None
    assert want_prompt[0] is None and have_prompt[0] is None
    _assert_close(want_prompt[1:], have_prompt[1:])

    # a second batch on the same workers (mirrored requests were dropped and re-sent)
    again = _run(llm)
    assert [o.outputs[0].token_ids for o in again] == [o.outputs[0].token_ids for o in expected]

    del llm, executor
    gc.collect()
    assert wait_gone(pids, timeout=15) == []
