"""Qwen3-MoE and Mixtral: plugin conformance, logits parity with transformers, per-expert
loading into the stacked tensors, and the errors for mismatched checkpoints."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import engine_moe.plugin
import pytest
import torch
from engine_moe.model import MixtralForCausalLM, MoeBlock, Qwen3MoeForCausalLM
from engine_reference.backend import ReferenceAttentionBackend
from engine_sdk.layers.activation import GatedMLP
from engine_sdk.testing import PluginConformance
from engine_sdk.testing.model_parity import assert_logits_match_transformers, load_float32_model

QWEN3_MOE = {"num_experts": 8, "num_experts_per_tok": 2, "moe_intermediate_size": 32}
MIXTRAL = {"num_local_experts": 4, "num_experts_per_tok": 2, "sliding_window": None}


class TestConformance(PluginConformance):
    plugin = engine_moe.plugin


@pytest.mark.parametrize("norm", [False, True])
def test_qwen3_moe_logits_match_transformers(tmp_path: Path, norm: bool) -> None:
    assert_logits_match_transformers(
        Qwen3MoeForCausalLM,
        "Qwen3MoeForCausalLM",
        tmp_path,
        ReferenceAttentionBackend,
        **QWEN3_MOE,
        norm_topk_prob=norm,
    )


def test_mixtral_logits_match_transformers(tmp_path: Path) -> None:
    assert_logits_match_transformers(
        MixtralForCausalLM, "MixtralForCausalLM", tmp_path, ReferenceAttentionBackend, **MIXTRAL
    )


def _load(tmp_path: Path, arch: str, model_cls: Any, **overrides: Any) -> tuple[Any, dict]:
    from engine_sdk.testing.models import build_tiny_model
    from safetensors.torch import load_file
    from transformers import AutoConfig

    model_dir = build_tiny_model(tmp_path, arch, **overrides)
    weights = load_file(str(model_dir / "model.safetensors"))
    config = AutoConfig.from_pretrained(str(model_dir))
    model = load_float32_model(model_cls, config, weights.items(), ReferenceAttentionBackend)
    return model, weights


def test_mixtral_experts_are_stacked_gate_then_up(tmp_path: Path) -> None:
    model, weights = _load(tmp_path, "MixtralForCausalLM", MixtralForCausalLM, **MIXTRAL)
    experts = model.model.layers[1].mlp.experts
    prefix = "model.layers.1.block_sparse_moe.experts.3"
    inter = experts.intermediate
    assert torch.equal(experts.w13[3, :inter], weights[f"{prefix}.w1.weight"])
    assert torch.equal(experts.w13[3, inter:], weights[f"{prefix}.w3.weight"])
    assert torch.equal(experts.w2[3], weights[f"{prefix}.w2.weight"])


def test_qwen3_moe_dense_layers_follow_mlp_only_layers(tmp_path: Path) -> None:
    model, _ = _load(
        tmp_path, "Qwen3MoeForCausalLM", Qwen3MoeForCausalLM, **QWEN3_MOE, mlp_only_layers=[0]
    )
    assert isinstance(model.model.layers[0].mlp, GatedMLP)
    assert isinstance(model.model.layers[1].mlp, MoeBlock)


def test_expert_weights_for_a_dense_layer_are_named(tmp_path: Path) -> None:
    from engine_sdk.testing.models import build_tiny_model
    from safetensors.torch import load_file
    from transformers import AutoConfig

    model_dir = build_tiny_model(tmp_path, "Qwen3MoeForCausalLM", **QWEN3_MOE)
    weights = load_file(str(model_dir / "model.safetensors"))
    config: Any = AutoConfig.from_pretrained(str(model_dir))
    config.mlp_only_layers = [0]  # the checkpoint has experts in layer 0; the config says dense
    with pytest.raises(ValueError, match=r"model.layers.0.mlp.experts.*no experts at"):
        load_float32_model(Qwen3MoeForCausalLM, config, weights.items(), ReferenceAttentionBackend)
