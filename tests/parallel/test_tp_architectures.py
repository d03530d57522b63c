"""Tensor parallelism (TP=2, CPU gloo) of the newer architectures: greedy tokens equal TP=1.

Qwen3-MoE shards every expert's intermediate dimension (16 of 32 per rank) and replicates
the router; Phi-3's fused checkpoint tensors are split before the column-parallel shards
take their rows; Gemma 2's soft caps and local/global layers run per rank's heads.
"""

from __future__ import annotations

from typing import Any

import pytest
from engine import LLM, SamplingParams
from engine_sdk.testing.models import build_tiny_model
from tp_helpers import BASE

PROMPTS = ["Hello world! How are you today?", "The quick brown fox", "Café 東京 😀", "A"]

CASES: dict[str, tuple[str, dict[str, Any]]] = {
    "qwen3-moe": (
        "Qwen3MoeForCausalLM",
        {"num_experts": 8, "num_experts_per_tok": 2, "moe_intermediate_size": 32},
    ),
    "phi3": ("Phi3ForCausalLM", {}),
    "gemma2": (
        "Gemma2ForCausalLM",
        {
            "query_pre_attn_scalar": 24,
            "sliding_window": 4,
            "attn_logit_softcapping": 0.5,
            "final_logit_softcapping": 1.0,
            "tie_word_embeddings": True,
        },
    ),
}


@pytest.mark.timeout(600)
@pytest.mark.parametrize("case", list(CASES))
def test_tp2_greedy_matches_tp1(tmp_path_factory: pytest.TempPathFactory, case: str) -> None:
    arch, overrides = CASES[case]
    path = str(build_tiny_model(tmp_path_factory.mktemp(case), arch, **overrides))
    params = SamplingParams(temperature=0.0, max_tokens=8, ignore_eos=True)
    tp1 = LLM(model=path, kv_cache_memory_bytes=1 << 20, **BASE)
    want = [o.outputs[0].token_ids for o in tp1.generate(PROMPTS, params, use_tqdm=False)]
    assert len({tuple(w) for w in want}) > 1
    del tp1
    llm = LLM(model=path, tensor_parallel_size=2, kv_cache_memory_bytes=1 << 20, **BASE)
    got = [o.outputs[0].token_ids for o in llm.generate(PROMPTS, params, use_tqdm=False)]
    assert got == want
