"""The llama3_json parser on Llama 3.1/3.2/3.3 JSON tool-call outputs."""

from __future__ import annotations

from engine_sdk.testing.parsers import ToolParserConformance, ToolTranscript
from engine_toolparsers.llama3_json import Llama3JsonToolParser

TRANSCRIPTS = [
    ToolTranscript(
        '<|python_tag|>{"name": "get_weather", "parameters": {"city": "Paris"}}',
        expected_calls=[("get_weather", {"city": "Paris"})],
        expected_content=None,
        label="python tag, one call",
    ),
    ToolTranscript(
        '{"name": "a", "parameters": {"x": 1}}; {"name": "b", "parameters": '
        '{"y": "Grüße \\u00e9 🙂", "nested": {"list": [1, {"z": null}], "ok": true}}}',
        expected_calls=[
            ("a", {"x": 1}),
            ("b", {"y": "Grüße é 🙂", "nested": {"list": [1, {"z": None}], "ok": True}}),
        ],
        expected_content=None,
        label="two calls separated by ';', unicode and nested",
    ),
    ToolTranscript(
        '\n{"name": "lookup", "arguments": {"id": 7}}\n{"name": "lookup", "arguments": {"id": 8}}',
        expected_calls=[("lookup", {"id": 7}), ("lookup", {"id": 8})],
        label="'arguments' key, newline-separated",
    ),
    ToolTranscript(
        "The capital of France is Paris.",
        expected_calls=[],
        expected_content="The capital of France is Paris.",
        label="plain answer",
    ),
    ToolTranscript(
        '{"answer": 42, "unit": "none"}',
        expected_calls=[],
        expected_content='{"answer": 42, "unit": "none"}',
        label="a JSON answer that is not a call",
    ),
    ToolTranscript(
        '{"name": "f", "parameters": {}}\nDone.',
        expected_calls=[("f", {})],
        expected_content="Done.",
        label="text after the call",
    ),
]


class TestLlama3JsonConformance(ToolParserConformance):
    parser_cls = Llama3JsonToolParser
    transcripts = TRANSCRIPTS


def test_text_before_json_is_not_a_call() -> None:
    text = 'Sure: {"name": "f", "parameters": {}}'
    result = Llama3JsonToolParser().extract_tool_calls(text)
    assert result.tool_calls == [] and result.content == text


def test_broken_second_object_keeps_the_first_call() -> None:
    text = '{"name": "a", "parameters": {}}; {"name": "b", "parameters": {'
    result = Llama3JsonToolParser().extract_tool_calls(text)
    assert [call.name for call in result.tool_calls] == ["a"]
    assert result.content == '{"name": "b", "parameters": {'
