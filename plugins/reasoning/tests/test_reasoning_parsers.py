"""qwen3 and deepseek_r1 reasoning parsers on real think-section outputs."""

from __future__ import annotations

import engine_reasoning.plugin
from engine_reasoning.deepseek_r1 import DeepSeekR1ReasoningParser
from engine_reasoning.qwen3 import Qwen3ReasoningParser
from engine_sdk.testing import PluginConformance
from engine_sdk.testing.parsers import ReasoningParserConformance, ReasoningTranscript

# Expected splits are those of vLLM's parsers of the same names (no whitespace stripped).
QWEN3 = [
    ReasoningTranscript(
        "<think>\nThe user asks 2+2. That is 4.\n</think>\n\nThe answer is **4**.",
        expected_reasoning="\nThe user asks 2+2. That is 4.\n",
        expected_content="\n\nThe answer is **4**.",
        label="thinking on",
    ),
    ReasoningTranscript(
        "<think>\n\n</think>\n\nBonjour, ça va ? 🙂",
        expected_reasoning="\n\n",
        expected_content="\n\nBonjour, ça va ? 🙂",
        label="empty think block (/no_think)",
    ),
    ReasoningTranscript(
        "No tags at all, with a < and </b> tag.",
        expected_reasoning="No tags at all, with a < and </b> tag.",
        expected_content=None,
        label="no tags: thinking was on and got cut off (vLLM since the Qwen3.5 templates)",
    ),
    ReasoningTranscript(
        "The template opened the block. 思考中…</think>Answer.",
        expected_reasoning="The template opened the block. 思考中…",
        expected_content="Answer.",
        label="no start tag, end tag present",
    ),
    ReasoningTranscript(
        "  <think>\nLong thought cut by max_tokens <thi",
        expected_reasoning="\nLong thought cut by max_tokens <thi",
        expected_content=None,
        label="truncated while thinking",
    ),
    ReasoningTranscript(
        "<think>a <think> nested</think>done</think>",
        expected_reasoning="a <think> nested",
        expected_content="done</think>",
        label="repeated tags",
    ),
    ReasoningTranscript(
        "</think>Only an answer.",
        expected_reasoning=None,
        expected_content="Only an answer.",
        label="empty reasoning",
    ),
    ReasoningTranscript(
        "Need the weather.\n<tool_call>\n<function=get_weather>\n<parameter=city>\nParis\n"
        "</parameter>\n</function>\n</tool_call>",
        expected_reasoning="Need the weather.\n",
        expected_content="<tool_call>\n<function=get_weather>\n<parameter=city>\nParis\n"
        "</parameter>\n</function>\n</tool_call>",
        label="Qwen3.5: a tool call ends the think section without </think>",
    ),
    ReasoningTranscript(
        "I could write <tool_call> here, then <tool_call>\n<function=f>",
        expected_reasoning="I could write <tool_call> here, then <tool_call>\n<function=f>",
        expected_content=None,
        label="only the first <tool_call> counts, and a bare mention is reasoning",
    ),
    ReasoningTranscript(
        "Thinking <tool_call>\n<function=f> then </think>after",
        expected_reasoning="Thinking <tool_call>\n<function=f> then ",
        expected_content="after",
        label="</think> wins over the implicit end",
    ),
]

DEEPSEEK_R1 = [
    ReasoningTranscript(
        "Okay, so the user wants 2+2.\nThat's 4.\n</think>\n\n**4**",
        expected_reasoning="Okay, so the user wants 2+2.\nThat's 4.\n",
        expected_content="\n\n**4**",
        label="template opened <think>",
    ),
    ReasoningTranscript(
        "<think>\nRepeated start tag.\n</think>Answer: ✓",
        expected_reasoning="\nRepeated start tag.\n",
        expected_content="Answer: ✓",
        label="model repeats <think>",
    ),
    ReasoningTranscript(
        "Still thinking when max_tokens hit </thi",
        expected_reasoning="Still thinking when max_tokens hit </thi",
        expected_content=None,
        label="truncated",
    ),
    ReasoningTranscript(
        "</think>Only an answer.",
        expected_reasoning=None,
        expected_content="Only an answer.",
        label="empty reasoning",
    ),
    ReasoningTranscript(
        "<think>Thought.</think>",
        expected_reasoning="Thought.",
        expected_content=None,
        label="nothing after </think>",
    ),
]


class TestQwen3Conformance(ReasoningParserConformance):
    parser_cls = Qwen3ReasoningParser
    transcripts = QWEN3


class TestDeepSeekR1Conformance(ReasoningParserConformance):
    parser_cls = DeepSeekR1ReasoningParser
    transcripts = DEEPSEEK_R1


class TestPluginConformance(PluginConformance):
    plugin = engine_reasoning.plugin


def test_qwen3_streams_reasoning_as_soon_as_the_block_opens() -> None:
    parser = Qwen3ReasoningParser()
    delta = parser.extract_reasoning_streaming("", "<think>\nHmm", "<think>\nHmm")
    assert delta is not None and delta.reasoning_content == "\nHmm" and not delta.content
    delta = parser.extract_reasoning_streaming("<think>\nHmm", "<think>\nHmm</th", "</th")
    assert delta is None  # a partial end tag is held back
    delta = parser.extract_reasoning_streaming(
        "<think>\nHmm</th", "<think>\nHmm</think>Hi", "ink>Hi"
    )
    assert delta is not None and delta.content == "Hi" and not delta.reasoning_content


def test_qwen3_streams_untagged_output_token_by_token() -> None:
    parser = Qwen3ReasoningParser()
    text = ""
    for piece in ["Hello", " there", ",", " friend"]:
        delta = parser.extract_reasoning_streaming(text, text + piece, piece)
        text += piece
        assert delta is not None and delta.reasoning_content == piece and not delta.content
    assert parser.finish_streaming(text) is None


def test_qwen3_holds_a_possible_tool_call_end_until_decided() -> None:
    parser = Qwen3ReasoningParser()
    first = parser.extract_reasoning_streaming("", "Plan <tool_call>\n", "Plan <tool_call>\n")
    assert first is not None and first.reasoning_content == "Plan "
    text = "Plan <tool_call>\n<function=f>"
    assert parser.extract_reasoning_streaming("Plan <tool_call>\n", text, "<function=f>") is None
    flushed = parser.finish_streaming(text)
    assert flushed is not None and flushed.content == "<tool_call>\n<function=f>"


def test_deepseek_r1_streams_reasoning_without_a_start_tag() -> None:
    parser = DeepSeekR1ReasoningParser()
    delta = parser.extract_reasoning_streaming("", "Okay, so", "Okay, so")
    assert delta is not None and delta.reasoning_content == "Okay, so"


def test_is_reasoning_end() -> None:
    for parser in (Qwen3ReasoningParser(), DeepSeekR1ReasoningParser()):
        assert not parser.is_reasoning_end("<think>\nstill thinking")
        assert parser.is_reasoning_end("<think>\nthought</think>")
        assert parser.is_reasoning_end("thought</think>\n\nanswer")
