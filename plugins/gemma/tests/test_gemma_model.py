"""Gemma 2 / Gemma 3 (text): plugin conformance, the layers against transformers' own, and
logits parity (head_dim 256, local/global layers, soft caps, per-layer-type rope)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import engine_gemma.plugin
import pytest
import torch
from engine_gemma.layers import GemmaRMSNorm, layer_type_of
from engine_gemma.model import Gemma2ForCausalLM, Gemma3ForCausalLM, rope_for_layer_type
from engine_reference.backend import ReferenceAttentionBackend
from engine_sdk.testing import PluginConformance
from engine_sdk.testing.model_parity import assert_logits_match_transformers

GEMMA = {
    "num_hidden_layers": 3,
    "num_attention_heads": 2,
    "num_key_value_heads": 1,
    "head_dim": 256,
    "query_pre_attn_scalar": 224,
    "sliding_window": 4,
    "layer_types": ["sliding_attention", "full_attention", "sliding_attention"],
}


class TestConformance(PluginConformance):
    plugin = engine_gemma.plugin


def test_gemma2_logits_match_transformers(tmp_path: Path) -> None:
    assert_logits_match_transformers(
        Gemma2ForCausalLM,
        "Gemma2ForCausalLM",
        tmp_path,
        ReferenceAttentionBackend,
        **GEMMA,
        attn_logit_softcapping=0.5,
        final_logit_softcapping=1.0,
        tie_word_embeddings=True,
    )


@pytest.mark.parametrize("tie", [True, False])
def test_gemma3_logits_match_transformers(tmp_path: Path, tie: bool) -> None:
    assert_logits_match_transformers(
        Gemma3ForCausalLM,
        "Gemma3ForCausalLM",
        tmp_path,
        ReferenceAttentionBackend,
        **GEMMA,
        rope_theta=1000000.0,
        rope_local_base_freq=10000.0,
        rope_scaling={"rope_type": "linear", "factor": 8.0},
        tie_word_embeddings=tie,
    )


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
def test_norm_is_one_plus_weight_as_transformers(dtype: torch.dtype) -> None:
    from transformers.models.gemma2.modeling_gemma2 import Gemma2RMSNorm

    gen = torch.Generator().manual_seed(0)
    weight = torch.randn(32, generator=gen) * 0.5
    x = torch.randn(5, 32, generator=gen).to(dtype)
    ours = GemmaRMSNorm(32, 1e-6, dtype)
    ours.weight.data.copy_(weight)
    theirs = Gemma2RMSNorm(32, eps=1e-6)
    theirs.weight.data.copy_(weight)
    # bf16 weights round before the 1 + w, as a bf16 checkpoint's do.
    want = theirs.to(dtype)(x)
    assert torch.equal(ours(x), want)


def test_layer_types_and_their_ropes() -> None:
    from transformers import AutoConfig

    cfg: Any = AutoConfig.for_model(
        "gemma3_text",
        num_hidden_layers=6,
        head_dim=16,
        rope_theta=1000000.0,
        rope_local_base_freq=10000.0,
        rope_scaling={"rope_type": "linear", "factor": 8.0},
    )
    types = [layer_type_of(cfg, i) for i in range(6)]
    assert types == ["sliding_attention"] * 5 + ["full_attention"]
    local = rope_for_layer_type(cfg, "sliding_attention", 16)
    full = rope_for_layer_type(cfg, "full_attention", 16)
    assert (local.rope_type, local.rope_theta) == ("default", 10000.0)
    assert (full.rope_type, full.rope_theta, full.params["factor"]) == ("linear", 1e6, 8.0)


def test_layer_type_pattern_without_layer_types() -> None:
    class Old:
        layer_types = None
        sliding_window_pattern = 3

    assert [layer_type_of(Old(), i) for i in range(4)] == [
        "sliding_attention",
        "sliding_attention",
        "full_attention",
        "sliding_attention",
    ]
