"""LlamaForCausalLM: plugin conformance and logits parity with transformers (SDK layers only)."""

from __future__ import annotations

from pathlib import Path

import engine_llama.plugin
import pytest
from engine_llama.model import LlamaForCausalLM
from engine_reference.backend import ReferenceAttentionBackend
from engine_sdk.testing import PluginConformance
from engine_sdk.testing.model_parity import assert_logits_match_transformers


class TestConformance(PluginConformance):
    plugin = engine_llama.plugin


@pytest.mark.parametrize("tie", [False, True])
def test_logits_match_transformers(tmp_path: Path, tie: bool) -> None:
    assert_logits_match_transformers(
        LlamaForCausalLM,
        "LlamaForCausalLM",
        tmp_path,
        ReferenceAttentionBackend,
        tie_word_embeddings=tie,
    )
