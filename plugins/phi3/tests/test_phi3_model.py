"""Phi3ForCausalLM: plugin conformance, fused-tensor loading and logits parity with
transformers (head_dim 96, LongRoPE over a partial rotary dimension)."""

from __future__ import annotations

from pathlib import Path

import engine_phi3.plugin
import pytest
import torch
from engine_phi3.model import Phi3ForCausalLM
from engine_reference.backend import ReferenceAttentionBackend
from engine_sdk.testing import PluginConformance
from engine_sdk.testing.model_parity import assert_logits_match_transformers, load_float32_model

PHI3 = {"hidden_size": 192, "num_attention_heads": 2, "num_key_value_heads": 1, "head_dim": 96}


class TestConformance(PluginConformance):
    plugin = engine_phi3.plugin


def test_logits_match_transformers(tmp_path: Path) -> None:
    assert_logits_match_transformers(
        Phi3ForCausalLM, "Phi3ForCausalLM", tmp_path, ReferenceAttentionBackend, **PHI3
    )


def test_longrope_logits_match_transformers(tmp_path: Path) -> None:
    # 11 prompt tokens past an original context of 8: the long factors apply.
    assert_logits_match_transformers(
        Phi3ForCausalLM,
        "Phi3ForCausalLM",
        tmp_path,
        ReferenceAttentionBackend,
        **PHI3,
        original_max_position_embeddings=8,
        rope_scaling={
            "type": "longrope",
            "short_factor": [1.0 + 0.1 * i for i in range(48)],
            "long_factor": [2.0 + 0.5 * i for i in range(48)],
        },
    )


def test_fused_tensors_split_into_projections(tmp_path: Path) -> None:
    from engine_sdk.testing.models import build_tiny_model
    from safetensors.torch import load_file
    from transformers import AutoConfig

    model_dir = build_tiny_model(tmp_path, "Phi3ForCausalLM", **PHI3)
    weights = load_file(str(model_dir / "model.safetensors"))
    config = AutoConfig.from_pretrained(str(model_dir))
    model = load_float32_model(Phi3ForCausalLM, config, weights.items(), ReferenceAttentionBackend)
    qkv = weights["model.layers.1.self_attn.qkv_proj.weight"]
    attn = model.model.layers[1].self_attn
    assert torch.equal(attn.q_proj.weight, qkv[:192])
    assert torch.equal(attn.k_proj.weight, qkv[192:288])
    assert torch.equal(attn.v_proj.weight, qkv[288:])
    gate_up = weights["model.layers.1.mlp.gate_up_proj.weight"]
    assert torch.equal(model.model.layers[1].mlp.up_proj.weight, gate_up[128:])


def test_fused_tensor_of_the_wrong_size_is_named(tmp_path: Path) -> None:
    from engine_sdk.testing.models import build_tiny_model
    from safetensors.torch import load_file
    from transformers import AutoConfig

    model_dir = build_tiny_model(tmp_path, "Phi3ForCausalLM", **PHI3)
    weights = load_file(str(model_dir / "model.safetensors"))
    name = "model.layers.0.self_attn.qkv_proj.weight"
    weights[name] = weights[name][:-1]
    config = AutoConfig.from_pretrained(str(model_dir))
    with pytest.raises(ValueError, match=r"qkv_proj.*expects 384 rows"):
        load_float32_model(Phi3ForCausalLM, config, weights.items(), ReferenceAttentionBackend)
