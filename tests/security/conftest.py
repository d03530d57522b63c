"""Fixtures of the security suite: one real ``engine serve`` (tiny random Qwen3, API key,
small bounds) shared by the session, and the tiny model for tests that start their own."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from sec_helpers import Server, free_port, serve_cmd


@pytest.fixture(scope="session")
def tiny_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from engine_sdk.testing.models import build_tiny_model

    return build_tiny_model(tmp_path_factory.mktemp("sec-tiny-qwen3"), "Qwen3ForCausalLM")


@pytest.fixture(scope="session")
def sec_server(tiny_model: Path) -> Iterator[Server]:
    port = free_port()
    server = Server(serve_cmd(tiny_model, port), port).start()
    yield server
    server.stop()
