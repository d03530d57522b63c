"""The mistral parser on both [TOOL_CALLS] forms (JSON array, name[ARGS]{...})."""

from __future__ import annotations

import re

from engine_sdk.testing.parsers import ToolParserConformance, ToolTranscript
from engine_toolparsers.mistral import MistralToolParser

TRANSCRIPTS = [
    ToolTranscript(
        'Sure.[TOOL_CALLS][{"name": "get_weather", "arguments": {"city": "Paris"}}, '
        '{"name": "get_time", "arguments": {"tz": "Europe/Paris"}}]',
        expected_calls=[("get_weather", {"city": "Paris"}), ("get_time", {"tz": "Europe/Paris"})],
        expected_content="Sure.",
        label="array form with content",
    ),
    ToolTranscript(
        '[TOOL_CALLS]get_weather[ARGS]{"city": "Zürich", "days": 3}'
        '[TOOL_CALLS]get_time[ARGS]{"tz": "CET"}',
        expected_calls=[
            ("get_weather", {"city": "Zürich", "days": 3}),
            ("get_time", {"tz": "CET"}),
        ],
        expected_content=None,
        label="name[ARGS] form, two calls",
    ),
    ToolTranscript(
        '[TOOL_CALLS]store[CALL_ID]a1b2c3d4e[ARGS]{"x": [1, 2, {"y": "ñ 😀"}], "z": {"w": null}}',
        expected_calls=[("store", {"x": [1, 2, {"y": "ñ 😀"}], "z": {"w": None}})],
        label="name[CALL_ID]id[ARGS] form, nested",
    ),
    ToolTranscript(
        "No tools needed [really], see [TOOL] docs.",
        expected_calls=[],
        expected_content="No tools needed [really], see [TOOL] docs.",
        label="plain text with brackets",
    ),
    ToolTranscript(
        "[TOOL_CALLS] not a call at all",
        expected_calls=[],
        expected_content="[TOOL_CALLS] not a call at all",
        label="marker followed by prose",
    ),
    ToolTranscript(
        '[TOOL_CALLS][{"name": "f", "arguments": "{\\"q\\": \\"v\\"}"}]',
        expected_calls=[("f", {"q": "v"})],
        label="string-encoded arguments in the array",
    ),
]


class TestMistralConformance(ToolParserConformance):
    parser_cls = MistralToolParser
    transcripts = TRANSCRIPTS


def test_call_ids_are_nine_alphanumerics() -> None:
    result = MistralToolParser().extract_tool_calls(TRANSCRIPTS[1].text)
    assert all(re.fullmatch(r"[A-Za-z0-9]{9}", call.id) for call in result.tool_calls)
    assert MistralToolParser.requires_special_tokens is True


def test_array_with_a_non_call_element_is_content() -> None:
    text = '[TOOL_CALLS][{"name": "f", "arguments": {}}, 42]'
    result = MistralToolParser().extract_tool_calls(text)
    assert result.tool_calls == [] and result.content == text
