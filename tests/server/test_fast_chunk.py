"""The hand-written streaming chunk of /v1/completions is byte-identical to what the
pydantic models give, for awkward text (quotes, control characters, non-ASCII) and every
kind of finish."""

from __future__ import annotations

import pytest
from engine.entrypoints.openai.choice_state import ChoiceDelta
from engine.entrypoints.openai.protocol import CompletionRequest
from engine.entrypoints.openai.serving_completion import CompletionServing, _fast_chunk, _Meta
from engine.entrypoints.openai.sse import sse_event

DELTAS = [
    ChoiceDelta('a\u0001京"\\\n\t😀 </s>', [1], [], None, None),
    ChoiceDelta("", [], [], "stop", "</s>"),
    ChoiceDelta("z", [2], [], "stop", 7),
    ChoiceDelta("last", [3], [], "length", None),
    ChoiceDelta("x", [4], [], "abort", None),
]


@pytest.mark.parametrize("delta", DELTAS)
def test_fast_chunk_equals_pydantic_chunk(delta: ChoiceDelta) -> None:
    meta = _Meta(
        "cmpl-é1", 1796283271, 'tiny "model" é', 1, CompletionRequest(model="m", prompt="x"), []
    )
    want = sse_event(CompletionServing._chunk(None, meta, 5, delta.text, None, delta))  # type: ignore[arg-type]
    assert _fast_chunk(meta, 5, delta) == want
