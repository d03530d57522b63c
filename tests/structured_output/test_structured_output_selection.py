"""Picking the grammar backend: auto by priority, by name, and clear errors."""

from __future__ import annotations

from typing import Any

import engine_outlines.plugin
import pytest
from engine.errors import StartupError
from engine.sampling_params import StructuredOutputsParams
from structured_output_fakes import BackendPlugin, ManagerFactory, broken_plugin, sleepy_plugin


def test_auto_picks_outlines_over_lower_priority(make_manager: ManagerFactory) -> None:
    manager = make_manager(engine_outlines.plugin, sleepy_plugin(priority=5))
    assert manager.backend_name == "outlines"


def test_auto_picks_highest_priority(make_manager: ManagerFactory) -> None:
    manager = make_manager(engine_outlines.plugin, sleepy_plugin(priority=50))
    assert manager.backend_name == "sleepy"


def test_named_backend(make_manager: ManagerFactory) -> None:
    manager = make_manager(engine_outlines.plugin, sleepy_plugin(50), backend="outlines")
    assert manager.backend_name == "outlines"
    assert type(manager.get_backend()).__name__ == "OutlinesBackend"


def test_unknown_name_lists_installed(make_manager: ManagerFactory) -> None:
    with pytest.raises(
        StartupError, match=r"'xgrammar' is not installed; installed: outlines, sleepy"
    ):
        make_manager(engine_outlines.plugin, sleepy_plugin(), backend="xgrammar")


def test_none_installed(make_manager: ManagerFactory) -> None:
    class NoBackends:
        __name__ = "no-backends"

    with pytest.raises(StartupError, match="no structured output backend is installed"):
        make_manager(NoBackends())


def test_unimportable_target_fails_at_construction(make_manager: ManagerFactory) -> None:
    plugin = BackendPlugin("ghost", "structured_output_fakes:DoesNotExist", 1)
    with pytest.raises(StartupError, match="cannot import 'structured_output_fakes:DoesNotExist'"):
        make_manager(plugin)


def test_backend_that_cannot_start_fails_each_compile(make_manager: ManagerFactory) -> None:
    manager = make_manager(broken_plugin())
    for _ in range(2):
        with pytest.raises(StartupError, match="'broken' cannot start.*native library"):
            manager.compile(StructuredOutputsParams(regex="a"))


def test_outlines_without_eos_explains(make_manager: ManagerFactory, tiny_tokenizer: Any) -> None:
    class NoEos:
        eos_token_id = None

        def __getattr__(self, name: str) -> Any:
            return getattr(tiny_tokenizer, name)

    manager = make_manager(tokenizer=NoEos(), eos_token_ids=[0])
    with pytest.raises(StartupError, match="no eos_token"):
        manager.compile(StructuredOutputsParams(regex="a"))
