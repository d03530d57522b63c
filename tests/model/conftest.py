"""Fixtures for model-execution tests: tiny checkpoints, an isolated plugin manager."""

from __future__ import annotations

from pathlib import Path

import pytest
from engine.plugins import PluginManager
from engine_sdk.testing.models import build_tiny_model


@pytest.fixture(scope="session")
def pm() -> PluginManager:
    """Only the first-party plugins this part needs (no entry-point discovery)."""
    import engine_llama.plugin
    import engine_qwen3.plugin
    import engine_reference.plugin

    plugins = [engine_reference.plugin, engine_qwen3.plugin, engine_llama.plugin]
    return PluginManager.load(discover=False, extra_plugins=plugins, env={})


@pytest.fixture(scope="session")
def qwen3_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_tiny_model(tmp_path_factory.mktemp("qwen3"), "Qwen3ForCausalLM")


@pytest.fixture(scope="session")
def llama_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_tiny_model(tmp_path_factory.mktemp("llama"), "LlamaForCausalLM")


@pytest.fixture(scope="session")
def model_dirs(qwen3_dir: Path, llama_dir: Path) -> dict[str, Path]:
    return {"Qwen3ForCausalLM": qwen3_dir, "LlamaForCausalLM": llama_dir}


@pytest.fixture(scope="session")
def pm_all() -> PluginManager:
    """Every installed plugin, discovered from entry points as `engine serve` does."""
    return PluginManager.load(env={})
