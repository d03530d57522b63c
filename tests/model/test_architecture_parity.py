"""Every model-architecture plugin against Hugging Face transformers on tiny random weights.

Per architecture (and per config variant that changes the math): float32 logits of a
whole prompt within 1e-4 of transformers', then greedy tokens equal to ``generate`` through
the real ``LLM`` with chunked prefill (16-token budget), prefix caching (each prompt twice)
and a KV pool small enough that the scheduler preempts and recomputes.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
from engine import LLM, SamplingParams
from engine_sdk.testing.models import build_tiny_model
from model_driver import hf_greedy, hf_model, make_runner
from test_model_parity import PROMPTS, _encode, _full_prompt_logits

BASE = {"device": "cpu", "dtype": "float32", "block_size": 4}
NUM_NEW = 10
LONG = PROMPTS[2] + " " + PROMPTS[0] + " " + PROMPTS[2]

# Phi-3's head_dim 96 (hidden 192 over 2 heads), as the real models have.
PHI3 = {"hidden_size": 192, "num_attention_heads": 2, "num_key_value_heads": 1, "head_dim": 96}
# LongRoPE over 72 rotary dims (partial factor 0.75, as Phi-4-mini): 36 factors each. The
# logits prompt (> 64 tokens) takes the long factors, the greedy runs (< 64) the short ones.
LONGROPE = {
    "partial_rotary_factor": 0.75,
    "original_max_position_embeddings": 64,
    "rope_scaling": {
        "type": "longrope",
        "short_factor": [1.0 + 0.05 * i for i in range(36)],
        "long_factor": [1.5 + 0.3 * i for i in range(36)],
    },
}

# Gemma at head_dim 256; caps small enough that tanh bends these random weights' scores.
GEMMA = {
    "num_hidden_layers": 3,
    "num_attention_heads": 2,
    "num_key_value_heads": 1,
    "head_dim": 256,
    "query_pre_attn_scalar": 224,
    "sliding_window": 8,
    "layer_types": ["sliding_attention", "full_attention", "sliding_attention"],
}
GEMMA2 = {**GEMMA, "attn_logit_softcapping": 0.5, "final_logit_softcapping": 1.0}
# Gemma 3 as its config.json on the Hub spells it (transformers nests it per layer type).
GEMMA3 = {
    **GEMMA,
    "rope_theta": 1000000.0,
    "rope_local_base_freq": 10000.0,
    "rope_scaling": {"rope_type": "linear", "factor": 8.0},
}

# 8 experts of which 2 (Mixtral) or 3 (Qwen3-MoE) per token; Qwen3-MoE's layer 1 dense.
QWEN3_MOE = {
    "num_experts": 8,
    "num_experts_per_tok": 3,
    "moe_intermediate_size": 32,
    "mlp_only_layers": [1],
}
MIXTRAL = {"num_local_experts": 8, "num_experts_per_tok": 2, "sliding_window": None}

VARIANTS: list[tuple[str, str, dict[str, Any]]] = [
    ("qwen2", "Qwen2ForCausalLM", {}),
    ("qwen2-tied", "Qwen2ForCausalLM", {"tie_word_embeddings": True}),
    (
        "qwen2-sliding",
        "Qwen2ForCausalLM",
        {"use_sliding_window": True, "sliding_window": 8, "max_window_layers": 1},
    ),
    ("phi3", "Phi3ForCausalLM", PHI3),
    ("phi3-longrope", "Phi3ForCausalLM", {**PHI3, **LONGROPE, "tie_word_embeddings": True}),
    ("gemma2", "Gemma2ForCausalLM", {**GEMMA2, "tie_word_embeddings": True}),
    ("gemma3", "Gemma3ForCausalLM", {**GEMMA3, "tie_word_embeddings": True}),
    ("qwen3-moe", "Qwen3MoeForCausalLM", {**QWEN3_MOE, "norm_topk_prob": False}),
    ("qwen3-moe-norm", "Qwen3MoeForCausalLM", {**QWEN3_MOE, "norm_topk_prob": True}),
    ("mixtral", "MixtralForCausalLM", MIXTRAL),
]


@pytest.fixture(scope="module")
def model_dirs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    return {
        name: build_tiny_model(tmp_path_factory.mktemp(name), arch, seed=1, **overrides)
        for name, arch, overrides in VARIANTS
    }


@pytest.mark.parametrize("name", [v[0] for v in VARIANTS])
def test_float32_logits_match_hf(name: str, pm_all: Any, model_dirs: dict[str, Path]) -> None:
    model_dir = model_dirs[name]
    prompt = _encode(model_dir, [LONG])[0]
    assert len(prompt) > 40  # past every sliding window of the variants
    runner = make_runner(pm_all, model_dir)
    ours = _full_prompt_logits(runner, prompt)
    with torch.no_grad():
        theirs = hf_model(model_dir)(torch.tensor([prompt])).logits[0].float()
    assert ours.shape == theirs.shape
    torch.testing.assert_close(ours, theirs, rtol=1e-4, atol=1e-4)


def _pool_bytes(model_dir: Path, num_blocks: int) -> int:
    probe = LLM(str(model_dir), kv_cache_memory_bytes=1 << 20, max_model_len=64, **BASE)
    per_block = probe.engine.runner.bytes_per_block
    return int(per_block() if callable(per_block) else per_block) * num_blocks


@pytest.mark.parametrize("name", [v[0] for v in VARIANTS])
def test_greedy_matches_hf_chunked_cached_preempted(name: str, model_dirs: dict[str, Path]) -> None:
    model_dir = model_dirs[name]
    prompts = _encode(model_dir, PROMPTS)
    hf = hf_model(model_dir)
    want = [hf_greedy(hf, p, NUM_NEW) for p in prompts]
    assert len({tuple(w) for w in want}) > 1
    llm = LLM(
        str(model_dir),
        kv_cache_memory_bytes=_pool_bytes(model_dir, 17),
        max_model_len=64,
        max_num_batched_tokens=16,
        enable_prefix_caching=True,
        **BASE,
    )
    params = SamplingParams(temperature=0.0, max_tokens=NUM_NEW, ignore_eos=True)
    outs = llm.generate([{"prompt_token_ids": p} for p in prompts * 2], params, use_tqdm=False)
    assert [o.outputs[0].token_ids for o in outs] == want * 2
    stats = llm.stats()
    assert stats.num_preemptions > 0
    assert stats.prefix_cache_hits > 0


def test_every_architecture_is_served_by_an_installed_plugin(pm_all: Any) -> None:
    """What `engine plugins list` shows: each architecture here resolves through entry points."""
    served = pm_all.registry.architectures()
    for arch in sorted({arch for _, arch, _ in VARIANTS}):
        assert arch in served
        spec = pm_all.registry.architecture(arch)[0]  # declared once, on the spec
        assert arch in spec.architectures
        assert pm_all.find_model_architecture(arch) is pm_all.registry.resolve(
            "model_architecture", spec.name
        )


@pytest.mark.parametrize("name", ["qwen2", "phi3-longrope", "gemma2", "gemma3", "qwen3-moe"])
def test_bfloat16_runs_and_mostly_agrees(
    name: str, pm_all: Any, model_dirs: dict[str, Path]
) -> None:
    """bf16 weights and activations (what a GPU runs): close to the float32 reference."""
    model_dir = model_dirs[name]
    prompt = _encode(model_dir, [PROMPTS[0]])[0]
    runner = make_runner(pm_all, model_dir, dtype="bfloat16")
    assert runner.kv_caches[0].dtype == torch.bfloat16
    ours = _full_prompt_logits(runner, prompt)
    with torch.no_grad():
        theirs = hf_model(model_dir)(torch.tensor([prompt])).logits[0].float()
    assert (ours.argmax(-1) == theirs.argmax(-1)).float().mean() >= 0.75
    assert (ours - theirs).abs().max() < 0.15 * theirs.abs().max()
