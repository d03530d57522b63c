"""The pythonic parser on Llama 3.2 / Llama 4 Python-list tool calls."""

from __future__ import annotations

from pathlib import Path

from engine_sdk.testing.parsers import ToolParserConformance, ToolTranscript
from engine_toolparsers.pythonic import PythonicToolParser

TRANSCRIPTS = [
    ToolTranscript(
        "[get_weather(city=\"Paris\", days=3), get_time(tz='CET')]",
        expected_calls=[("get_weather", {"city": "Paris", "days": 3}), ("get_time", {"tz": "CET"})],
        expected_content=None,
        label="two calls",
    ),
    ToolTranscript(
        '<|python_start|>[search(query="日本 🍣 \\"x\\"", filters={"max": 10, "tags": ["a", "b"]}, '
        "exact=true, limit=None, ratio=-0.5)]<|python_end|>",
        expected_calls=[
            (
                "search",
                {
                    "query": '日本 🍣 "x"',
                    "filters": {"max": 10, "tags": ["a", "b"]},
                    "exact": True,
                    "limit": None,
                    "ratio": -0.5,
                },
            )
        ],
        expected_content=None,
        label="Llama 4 tags, unicode, nested, JSON names",
    ),
    ToolTranscript(
        "[note(text=\"a ] b ) c\", other='it\\'s', items=(1, 2)), tools.ping()]\nLet me know.",
        expected_calls=[
            ("note", {"text": "a ] b ) c", "other": "it's", "items": [1, 2]}),
            ("tools.ping", {}),
        ],
        expected_content="Let me know.",
        label="brackets inside strings, tuple, dotted name, content after",
    ),
    ToolTranscript(
        "Hello there, nothing to call.",
        expected_calls=[],
        expected_content="Hello there, nothing to call.",
        label="plain text",
    ),
    ToolTranscript(
        "[1, 2, 3] are numbers",
        expected_calls=[],
        expected_content="[1, 2, 3] are numbers",
        label="a list that is not calls",
    ),
]


class TestPythonicConformance(ToolParserConformance):
    parser_cls = PythonicToolParser
    transcripts = TRANSCRIPTS


def test_code_in_arguments_is_never_executed(tmp_path: Path) -> None:
    marker = tmp_path / "pwned"
    for text in (
        f'[f(x=open("{marker}", "w").write("x"))]',
        f'[__import__("pathlib").Path("{marker}").touch()]',
        f'[f(**{{"x": open("{marker}", "w")}})]',
        f'[f(open("{marker}", "w"))]',
    ):
        result = PythonicToolParser().extract_tool_calls(text)
        assert result.tool_calls == [] and result.content == text
    assert not marker.exists()


def test_unencodable_values_are_content() -> None:
    for text in ("[f(x={1, 2})]", "[f(x=b'raw')]", "[f(x=1e999)]", "[f(x=1j)]"):
        result = PythonicToolParser().extract_tool_calls(text)
        assert result.tool_calls == [] and result.content == text
