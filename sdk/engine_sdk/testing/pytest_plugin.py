"""The ``engine_sdk`` pytest plugin: fixtures for plugin authors (loaded automatically).

Fixtures:
  ``engine_plugin_manager``  an :class:`IsolatedPluginManager` (no entry-point discovery);
                             ``engine_plugin_manager.register(my_plugin_module)``
  ``tiny_model_dir``         a factory: ``tiny_model_dir("Qwen3ForCausalLM", **overrides)``
                             writes a tiny random HF checkpoint and returns its folder

This module is imported by pytest in every project that has engine-sdk installed, so it
imports neither torch nor anything heavy; the model builder is imported inside the fixture.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from engine_sdk.testing.plugin_manager import IsolatedPluginManager

TinyModelFactory = Callable[..., Path]


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "gpu: needs a CUDA GPU")
    config.addinivalue_line("markers", "slow: takes more than a few seconds")


@pytest.fixture
def engine_plugin_manager() -> IsolatedPluginManager:
    """A plugin manager holding only the plugins the test registers."""
    return IsolatedPluginManager()


@pytest.fixture
def tiny_model_dir(tmp_path_factory: pytest.TempPathFactory) -> TinyModelFactory:
    """Factory for tiny random checkpoints: ``tiny_model_dir(architecture, **overrides)``."""

    def make(architecture: str, **overrides: Any) -> Path:
        from engine_sdk.testing.models import build_tiny_model

        path = tmp_path_factory.mktemp(f"tiny-{architecture}")
        return build_tiny_model(path, architecture, **overrides)

    return make
