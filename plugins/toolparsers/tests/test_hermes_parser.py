"""The hermes parser on Hermes / Qwen2.5 / Qwen3 outputs, through the conformance suite."""

from __future__ import annotations

import json

from engine_sdk.testing.parsers import ToolParserConformance, ToolTranscript
from engine_toolparsers.hermes import HermesToolParser

WEATHER = {"city": "Paris", "unit": "celsius"}
MESSAGE = {
    "to": "José",
    "text": '你好 🙂 "quoted" \\ back',
    "meta": {"tags": ["a", "b"], "priority": 1, "ratio": 0.5, "draft": False, "reply_to": None},
}

TRANSCRIPTS = [
    ToolTranscript(
        "I'll check the weather.\n\n<tool_call>\n"
        '{"name": "get_weather", "arguments": {"city": "Paris", "unit": "celsius"}}\n'
        "</tool_call>",
        expected_calls=[("get_weather", WEATHER)],
        expected_content="I'll check the weather.",
        label="content then one call",
    ),
    ToolTranscript(
        '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris", "unit": "celsius"}}'
        '\n</tool_call>\n<tool_call>\n{"name": "send_message", "arguments": '
        + json.dumps(MESSAGE)
        + "}\n</tool_call>",
        expected_calls=[("get_weather", WEATHER), ("send_message", MESSAGE)],
        expected_content=None,
        label="two calls, escaped unicode and nested arguments",
    ),
    ToolTranscript(
        '<tool_call>\n{"name": "send_message", "arguments": '
        + json.dumps(MESSAGE, ensure_ascii=False)
        + "}\n</tool_call>\nI sent it.",
        expected_calls=[("send_message", MESSAGE)],
        expected_content="I sent it.",
        label="raw unicode, content after the call",
    ),
    ToolTranscript(
        "The answer is 42. Use the <tool> element, not <tool_calls>.\n",
        expected_calls=[],
        expected_content="The answer is 42. Use the <tool> element, not <tool_calls>.\n",
        label="no call, marker-like text",
    ),
    ToolTranscript(
        "<tool_call>\n{bad json}\n</tool_call>\n<tool_call>\n"
        '{"name": "ping", "arguments": {}}\n</tool_call>',
        expected_calls=[("ping", {})],
        expected_content="<tool_call>\n{bad json}\n</tool_call>",
        label="a malformed block stays content",
    ),
    ToolTranscript(
        '<tool_call>\n{"name": "f", "arguments": "{\\"x\\": 1}"}\n',
        expected_calls=[("f", {"x": 1})],
        expected_content=None,
        label="unclosed block with complete JSON, string-encoded arguments",
    ),
    ToolTranscript(
        'Step one.\n<tool_call>\n{"name": "a", "arguments": {}}\n</tool_call>\nStep two.\n'
        '<tool_call>\n{"name": "b", "parameters": {"k": [1, 2]}}\n</tool_call>\n',
        expected_calls=[("a", {}), ("b", {"k": [1, 2]})],
        expected_content="Step one.\nStep two.",
        label="content between calls",
    ),
]


class TestHermesConformance(ToolParserConformance):
    parser_cls = HermesToolParser
    transcripts = TRANSCRIPTS


def test_arguments_are_the_models_own_json_text() -> None:
    # As written (here with ASCII escapes), so they can stream while being generated.
    text = TRANSCRIPTS[1].text
    result = HermesToolParser().extract_tool_calls(text)
    arguments = result.tool_calls[1].arguments
    assert json.loads(arguments) == MESSAGE and arguments in text


def test_arguments_stream_while_the_call_is_generated() -> None:
    parser = HermesToolParser()
    text = 'Hi <tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris", "days": 3}}'
    pieces: list[tuple[int, str | None, str | None]] = []
    previous = ""
    for end in range(1, len(text) + 1):
        delta = parser.extract_tool_calls_streaming(previous, text[:end], text[end - 1], None)
        previous = text[:end]
        for d in delta.tool_calls if delta else []:
            pieces.append((d.index, d.name, d.arguments))
    assert pieces[0] == (0, "get_weather", "")
    fragments = [args for _, name, args in pieces[1:] if name is None]
    assert len(fragments) > 5 and "".join(fragments) == '{"city": "Paris", "days": 3}'


def test_truncated_call_is_content_unchanged() -> None:
    text = 'Hi <tool_call>\n{"name": "get_weather", "arguments": {"city": "Par'
    result = HermesToolParser().extract_tool_calls(text)
    assert result.tool_calls == [] and result.content == text


def test_streaming_holds_back_a_partial_marker_and_flushes_it_at_the_end() -> None:
    parser = HermesToolParser()
    first = parser.extract_tool_calls_streaming("", "Hello <tool_", "Hello <tool_")
    assert first is not None and first.content == "Hello"
    assert parser.finish_streaming("Hello <tool_") is not None


def test_streamed_call_carries_index_id_name_and_arguments() -> None:
    text = TRANSCRIPTS[0].text
    parser = HermesToolParser()
    deltas = [parser.extract_tool_calls_streaming("", text, text)]
    call = deltas[0].tool_calls[0]
    assert (call.index, call.name) == (0, "get_weather")
    assert call.id and call.id.startswith("call_")
    assert json.loads(call.arguments) == WEATHER
    assert parser.finish_streaming(text) is None
