"""Fixtures: a tiny random Qwen3 checkpoint and real ``engine serve`` subprocesses on it,
one per configuration (session scope, so the whole directory starts each once)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from features_server import HERE, Server, start_server


@pytest.fixture(scope="session")
def tiny_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from engine_sdk.testing.models import build_tiny_model

    # Long enough for the tool-calling system prompt (about one token per character).
    folder = tmp_path_factory.mktemp("tiny-qwen3-features")
    return build_tiny_model(folder, "Qwen3ForCausalLM", max_position_embeddings=2048)


@pytest.fixture(scope="session")
def tools_server(tiny_model: Path) -> Iterator[Server]:
    """Structured outputs and tools (hermes for tool_choice auto)."""
    server = start_server(tiny_model, "--enable-auto-tool-choice", "--tool-call-parser", "hermes")
    yield server
    server.stop()


@pytest.fixture(scope="session")
def reasoning_server(tiny_model: Path) -> Iterator[Server]:
    """--reasoning-parser qwen3 with a template that honours enable_thinking."""
    template = HERE / "thinking_template.jinja"
    server = start_server(
        tiny_model, "--reasoning-parser", "qwen3", "--chat-template", str(template)
    )
    yield server
    server.stop()


@pytest.fixture(scope="session")
def plain_server(tiny_model: Path) -> Iterator[Server]:
    """No --served-model-name (the default names) and no parsers."""
    server = start_server(tiny_model, served_name=None)
    yield server
    server.stop()
