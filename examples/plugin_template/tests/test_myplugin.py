"""Template tests: the generic conformance suite and the parser's behaviour."""

from __future__ import annotations

import json

import engine_myplugin.plugin
import pytest
from engine_myplugin.tool_parser import JsonToolParser
from engine_sdk.testing import PluginConformance


class TestConformance(PluginConformance):
    plugin = engine_myplugin.plugin
    expected = {"tool_parser": ["myplugin_json"]}


def test_single_call() -> None:
    out = JsonToolParser().extract_tool_calls('{"name": "f", "arguments": {"x": 1}}')
    assert out.content is None
    assert [(c.name, json.loads(c.arguments)) for c in out.tool_calls] == [("f", {"x": 1})]


def test_list_of_calls() -> None:
    text = '[{"name": "a", "arguments": {}}, {"name": "b", "arguments": {"y": "z"}}]'
    out = JsonToolParser().extract_tool_calls(text)
    assert [c.name for c in out.tool_calls] == ["a", "b"]


@pytest.mark.parametrize("text", ["hello", '{"name": 3}', "{not json", '["a"]', ""])
def test_not_a_call_is_content(text: str) -> None:
    out = JsonToolParser().extract_tool_calls(text)
    assert out.tool_calls == [] and out.content == text


def _stream(text: str, chunk: int) -> tuple[str, list[tuple[str | None, str | None]]]:
    parser, content, calls, previous = JsonToolParser(), "", [], ""
    deltas = []
    for start in range(0, len(text), chunk):
        current = previous + text[start : start + chunk]
        deltas.append(
            parser.extract_tool_calls_streaming(previous, current, current[len(previous) :])
        )
        previous = current
    deltas.append(parser.finish_streaming(previous))
    for delta in deltas:
        if delta is not None:
            content += delta.content or ""
            calls += [(d.name, d.arguments) for d in delta.tool_calls]
    return content, calls


@pytest.mark.parametrize("chunk", [1, 4, 100])
@pytest.mark.parametrize(
    "text", ['{"name": "f", "arguments": {"x": 1}}', "plain answer", " {broken", "  hi"]
)
def test_streaming_equals_whole(text: str, chunk: int) -> None:
    whole = JsonToolParser().extract_tool_calls(text)
    content, calls = _stream(text, chunk)
    assert content == (whole.content or "")
    assert calls == [(c.name, c.arguments) for c in whole.tool_calls]
