"""Qwen2ForCausalLM: plugin conformance and logits parity with transformers (SDK layers only)."""

from __future__ import annotations

from pathlib import Path

import engine_qwen2.plugin
import pytest
from engine_qwen2.model import Qwen2ForCausalLM
from engine_reference.backend import ReferenceAttentionBackend
from engine_sdk.testing import PluginConformance
from engine_sdk.testing.model_parity import assert_logits_match_transformers


class TestConformance(PluginConformance):
    plugin = engine_qwen2.plugin


@pytest.mark.parametrize("tie", [False, True])
def test_logits_match_transformers(tmp_path: Path, tie: bool) -> None:
    assert_logits_match_transformers(
        Qwen2ForCausalLM,
        "Qwen2ForCausalLM",
        tmp_path,
        ReferenceAttentionBackend,
        tie_word_embeddings=tie,
    )


def test_qkv_have_bias_and_o_proj_has_none(tmp_path: Path) -> None:
    from engine_sdk.testing.models import build_tiny_model
    from safetensors.torch import load_file

    model_dir = build_tiny_model(tmp_path, "Qwen2ForCausalLM")
    names = set(load_file(str(model_dir / "model.safetensors")))
    assert "model.layers.0.self_attn.q_proj.bias" in names
    assert "model.layers.0.self_attn.o_proj.bias" not in names
