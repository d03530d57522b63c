"""The collector's settings after an engine starts (``engine.gc_tuning``): the startup
objects frozen and a default young-generation threshold raised, a program's own setting
kept; checked on the real ``LLM`` too."""

from __future__ import annotations

import gc
from collections.abc import Iterator
from pathlib import Path

import pytest
from engine import LLM
from engine.gc_tuning import GEN0_THRESHOLD, settle_after_startup
from engine_sdk.testing.models import build_tiny_model


@pytest.fixture
def restore_gc() -> Iterator[None]:
    before = gc.get_threshold()
    yield
    gc.set_threshold(*before)
    gc.unfreeze()


@pytest.mark.parametrize(
    ("start", "want"),
    [(700, GEN0_THRESHOLD), (100, GEN0_THRESHOLD), (0, 0), (50_000, 50_000)],
    ids=["cpython-default", "lower", "collection-off", "program-raised"],
)
def test_threshold_raised_only_from_a_default(restore_gc, start: int, want: int) -> None:
    gc.set_threshold(start, 10, 10)
    settle_after_startup()
    assert gc.get_threshold() == (want, 10, 10)
    assert gc.get_freeze_count() > 0


def test_llm_startup_applies_it(restore_gc, tmp_path: Path) -> None:
    model = build_tiny_model(tmp_path / "m", "Qwen3ForCausalLM", seed=0)
    gc.set_threshold(700, 10, 10)
    gc.unfreeze()
    llm = LLM(str(model), device="cpu", dtype="float32", kv_cache_memory_bytes=4 << 20)
    assert gc.get_threshold()[0] == GEN0_THRESHOLD
    assert gc.get_freeze_count() > 0
    del llm
