"""Fixtures of the tensor-parallel tests: tiny checkpoints."""

from __future__ import annotations

from pathlib import Path

import pytest
from engine_sdk.testing.models import build_tiny_model


@pytest.fixture(scope="session")
def qwen3_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """4 heads, 2 KV heads: TP=2 splits the KV heads."""
    return build_tiny_model(tmp_path_factory.mktemp("qwen3"), "Qwen3ForCausalLM")
