"""Fixtures for the structured-output manager tests: a tiny tokenizer and managers."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from structured_output_fakes import ManagerFactory, load_pm


@pytest.fixture(scope="session")
def tiny_tokenizer(tmp_path_factory: pytest.TempPathFactory) -> Any:
    from engine_sdk.testing.models import build_tiny_tokenizer

    return build_tiny_tokenizer(tmp_path_factory.mktemp("tiny-tokenizer"))


@pytest.fixture
def make_manager(tiny_tokenizer: Any) -> Iterator[ManagerFactory]:
    """``make_manager(*plugins, vocab_size=..., **config)``: a manager over the given plugins
    (default: engine-outlines), closed after the test."""
    import engine_outlines.plugin
    from engine.structured_output import StructuredOutputManager, StructuredOutputsConfig

    managers: list[Any] = []

    def make(
        *plugins: object,
        vocab_size: int | None = None,
        backend: str = "auto",
        eos_token_ids: list[int] | None = None,
        tokenizer: Any = None,
        **config: Any,
    ) -> Any:
        pm = load_pm(*(plugins or (engine_outlines.plugin,)))
        manager = StructuredOutputManager(
            tokenizer if tokenizer is not None else tiny_tokenizer,
            vocab_size or len(tiny_tokenizer),
            pm,
            backend,
            config=StructuredOutputsConfig(**config),
            eos_token_ids=eos_token_ids,
        )
        managers.append(manager)
        return manager

    yield make
    for manager in managers:
        manager.close()
