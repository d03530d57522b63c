"""Tests of the example plugin: generic conformance plus the parser's behaviour."""

from __future__ import annotations

import engine_example_reasoning.plugin
import pytest
from engine_example_reasoning.parser import TaggedReasoningParser
from engine_sdk.testing import PluginConformance


class TestConformance(PluginConformance):
    plugin = engine_example_reasoning.plugin
    expected = {"reasoning_parser": ["tagged_reasoning"]}


CASES = [
    ("<reasoning>2 + 2 is 4</reasoning>The answer is 4.", "2 + 2 is 4", "The answer is 4."),
    ("no tags at all", None, "no tags at all"),
    ("<reasoning>still thinking", "still thinking", None),
    ("Hi <reasoning>x</reasoning> y", "x", "Hi  y"),
    ("<reasoning></reasoning>answer", None, "answer"),
    ("a < b <reasoning>r</reasoning>c</reasoning>", "r", "a < b c</reasoning>"),
]


@pytest.mark.parametrize(("text", "reasoning", "content"), CASES)
def test_extract_reasoning(text: str, reasoning: str | None, content: str | None) -> None:
    assert TaggedReasoningParser().extract_reasoning(text) == (reasoning, content)


def _stream(text: str, chunk: int) -> tuple[str, str]:
    parser = TaggedReasoningParser()
    reasoning, content, previous = "", "", ""
    for start in range(0, len(text), chunk):
        delta_text = text[start : start + chunk]
        current = previous + delta_text
        delta = parser.extract_reasoning_streaming(previous, current, delta_text)
        if delta is not None:
            reasoning += delta.reasoning_content or ""
            content += delta.content or ""
        previous = current
    final = parser.finish_streaming(previous)
    if final is not None:
        reasoning += final.reasoning_content or ""
        content += final.content or ""
    return reasoning, content


@pytest.mark.parametrize(("text", "reasoning", "content"), CASES)
@pytest.mark.parametrize("chunk", [1, 2, 3, 5, 1000])
def test_streaming_equals_whole(
    text: str, reasoning: str | None, content: str | None, chunk: int
) -> None:
    assert _stream(text, chunk) == (reasoning or "", content or "")


def test_split_tag_is_held_back() -> None:
    parser = TaggedReasoningParser()
    assert parser.extract_reasoning_streaming("", "<reas", "<reas") is None
    delta = parser.extract_reasoning_streaming("<reas", "<reasoning>ab", "oning>ab")
    assert delta is not None and delta.reasoning_content == "ab" and delta.content is None


def test_is_reasoning_end() -> None:
    parser = TaggedReasoningParser()
    assert not parser.is_reasoning_end("<reasoning>abc")
    assert parser.is_reasoning_end("<reasoning>abc</reasoning>")
    assert not parser.is_reasoning_end("plain text</reasoning>")
