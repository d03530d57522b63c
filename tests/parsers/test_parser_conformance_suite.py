"""The parser conformance suites catch broken parsers (and pass correct ones)."""

from __future__ import annotations

from typing import Any

import pytest
from engine_reasoning.deepseek_r1 import DeepSeekR1ReasoningParser
from engine_reasoning.qwen3 import Qwen3ReasoningParser
from engine_sdk.interfaces.messages import DeltaMessage, ExtractedToolCalls, ToolCallDelta
from engine_sdk.interfaces.reasoning_parser import ReasoningParser
from engine_sdk.testing.parsers import (
    ReasoningTranscript,
    ToolTranscript,
    check_reasoning_parser,
    check_tool_parser,
    iter_splits,
    malformed_variants,
    stream_tool_calls,
)
from engine_toolparsers.hermes import HermesToolParser
from engine_toolparsers.pieces import Piece

HERMES = [
    'Checking.\n<tool_call>\n{"name": "f", "arguments": {"a": 1}}\n</tool_call>',
    'Just text with a <tag> and {"json": 1}.',
]


class _StreamsTooEarly(HermesToolParser):
    """Treats whatever it has as final: streams a half-generated block as content."""

    def split(self, text: str, final: bool, tools: list[dict[str, Any]] | None) -> list[Piece]:
        return super().split(text, True, tools)


class _RaisesOnGarbage(HermesToolParser):
    def extract_tool_calls(
        self, model_output: str, tools: list[dict[str, Any]] | None = None
    ) -> ExtractedToolCalls:
        if "{" in model_output and "name" not in model_output:
            raise ValueError("cannot parse")
        return super().extract_tool_calls(model_output, tools)


class _StripsContent(HermesToolParser):
    def extract_tool_calls(
        self, model_output: str, tools: list[dict[str, Any]] | None = None
    ) -> ExtractedToolCalls:
        result = super().extract_tool_calls(model_output, tools)
        result.content = (result.content or "").strip() or None
        return result

    def finish_streaming(self, current_text: str) -> DeltaMessage | None:
        return None  # also never flushes held-back whitespace


class _NoIdOnFirstDelta(HermesToolParser):
    def extract_tool_calls_streaming(self, *args: Any, **kwargs: Any) -> DeltaMessage | None:
        delta = super().extract_tool_calls_streaming(*args, **kwargs)
        if delta is not None:
            delta.tool_calls = [ToolCallDelta(index=c.index, name=c.name) for c in delta.tool_calls]
        return delta


@pytest.mark.parametrize(
    ("parser_cls", "message"),
    [
        (_StreamsTooEarly, "streaming differs from non-streaming"),
        (_RaisesOnGarbage, "raised ValueError"),
        (_StripsContent, "content"),
        (_NoIdOnFirstDelta, "must carry its id and name"),
    ],
)
def test_broken_tool_parsers_fail(parser_cls: type[HermesToolParser], message: str) -> None:
    with pytest.raises(AssertionError, match=message):
        check_tool_parser(parser_cls, HERMES)


def test_correct_tool_parser_passes_and_expectations_are_checked() -> None:
    check_tool_parser(HermesToolParser, HERMES)
    wrong = ToolTranscript(HERMES[0], expected_calls=[("f", {"a": 2})])
    with pytest.raises(AssertionError, match="expected"):
        check_tool_parser(HermesToolParser, [wrong], num_malformed=0)


class _VllmStyleQwen3(ReasoningParser):
    """No ``</think>`` means content, but streaming guesses reasoning after ``<think>``."""

    def extract_reasoning(self, model_output: str) -> tuple[str | None, str | None]:
        if "</think>" not in model_output:
            return None, model_output
        reasoning, _, content = model_output.partition("</think>")
        return reasoning.replace("<think>", ""), content or None

    def extract_reasoning_streaming(
        self, previous_text: str, current_text: str, delta_text: str
    ) -> DeltaMessage | None:
        if "</think>" in previous_text:
            return DeltaMessage(content=delta_text)
        return DeltaMessage(reasoning_content=delta_text.replace("<think>", ""))

    def is_reasoning_end(self, text: str) -> bool:
        return "</think>" in text


class _FlakyEnd(Qwen3ReasoningParser):
    def is_reasoning_end(self, text: str) -> bool:
        return text.endswith("</think>")


@pytest.mark.parametrize(
    ("parser_cls", "message"),
    [(_VllmStyleQwen3, "streaming differs"), (_FlakyEnd, "once the think section ended")],
)
def test_broken_reasoning_parsers_fail(parser_cls: type[ReasoningParser], message: str) -> None:
    with pytest.raises(AssertionError, match=message):
        check_reasoning_parser(parser_cls, ["<think>a</think>b", "<think>unfinished"])


def test_correct_reasoning_parsers_pass() -> None:
    check_reasoning_parser(DeepSeekR1ReasoningParser, ["a</think>b", "<think>x"])
    wrong = ReasoningTranscript("a</think>b", expected_content="c")
    with pytest.raises(AssertionError, match="expected"):
        check_reasoning_parser(DeepSeekR1ReasoningParser, [wrong], num_malformed=0)


def test_splits_cover_every_single_split_point_and_are_deterministic() -> None:
    text = "abcd"
    splits = list(iter_splits(text, seed=3, num_random=5))
    assert all("".join(chunks) == text for chunks in splits)
    for point in range(len(text) + 1):
        assert [text[:point], text[point:]] in splits
    assert list("abcd") in splits
    assert splits == list(iter_splits(text, seed=3, num_random=5))
    assert malformed_variants(HERMES, seed=1) == malformed_variants(HERMES, seed=1)
    assert malformed_variants(HERMES, seed=1) != malformed_variants(HERMES, seed=2)


def test_stream_tool_calls_assembles_fragments() -> None:
    class _Fragments(HermesToolParser):
        def extract_tool_calls_streaming(self, *args: Any, **kwargs: Any) -> DeltaMessage | None:
            delta = super().extract_tool_calls_streaming(*args, **kwargs)
            if delta is None or not delta.tool_calls:
                return delta
            first = delta.tool_calls[0]
            assert first.arguments is not None
            half = len(first.arguments) // 2
            delta.tool_calls = [
                ToolCallDelta(first.index, first.id, first.name, first.arguments[:half]),
                ToolCallDelta(first.index, None, None, first.arguments[half:]),
            ]
            return delta

    streamed = stream_tool_calls(_Fragments(), [HERMES[0]])
    assert [(name, arguments) for _, name, arguments in streamed.calls] == [("f", '{"a": 1}')]
    check_tool_parser(_Fragments, HERMES[:1], num_malformed=0)


def test_the_docs_example_parser_passes_the_suite() -> None:
    import re
    from pathlib import Path

    doc = Path(__file__).parents[2] / "docs" / "plugins" / "parsers.md"
    code = re.search(r"```python\n(class MyThinkParser.*?)```", doc.read_text(), re.S)
    assert code is not None, "the MyThinkParser example is missing from parsers.md"
    namespace: dict[str, Any] = {"ReasoningParser": ReasoningParser, "DeltaMessage": DeltaMessage}
    exec(code.group(1), namespace)  # our own documentation, not model output
    check_reasoning_parser(namespace["MyThinkParser"], ["hmm</think>answer", "a</thi", "plain"])
