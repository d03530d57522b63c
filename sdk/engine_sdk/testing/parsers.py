"""Conformance suites for tool-call and reasoning parser plugins.

Give the suite your parser class and a few real model outputs ("transcripts"); it checks
what the server relies on:

1. Streaming equals non-streaming for any split of the output into chunks: every single
   split point, one character per chunk, and random multi-splits (with empty chunks) from a
   fixed seed. Content and reasoning concatenate to the non-streaming strings (``None`` and
   ``""`` are the same); each streamed call has its index, id and name on its first delta,
   and its argument fragments concatenate to exactly the non-streaming arguments string
   (a ``streams_partial_calls`` parser may add one partial call for an output cut off
   inside a call).
2. Malformed output never raises: truncations of the transcripts, mutated transcripts
   (spans deleted, repeated, swapped) and random strings from a fixed seed. A tool parser
   that finds no call returns the output unchanged as content; a truncated output never
   has calls the whole output does not start with.
3. Optional expected results per transcript (``expected_calls``, ``expected_content``...).

Use it from a test file::

    from engine_sdk.testing.parsers import ToolParserConformance, ToolTranscript

    class TestMyParser(ToolParserConformance):
        parser_cls = MyToolParser
        transcripts = [ToolTranscript('<call>{"name": "f", "arguments": {}}</call>')]

or call :func:`check_tool_parser` / :func:`check_reasoning_parser`, which raise
``AssertionError`` naming the transcript and the chunks that failed. Imports no torch.
"""

from __future__ import annotations

import json
import random
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, ClassVar

from engine_sdk.interfaces.messages import DeltaMessage
from engine_sdk.interfaces.reasoning_parser import ReasoningParser
from engine_sdk.interfaces.tool_parser import ToolParser

__all__ = [
    "NOT_CHECKED",
    "ReasoningParserConformance",
    "ReasoningTranscript",
    "StreamedReasoning",
    "StreamedToolCalls",
    "ToolParserConformance",
    "ToolTranscript",
    "check_reasoning_parser",
    "check_tool_parser",
    "iter_splits",
    "malformed_variants",
    "stream_reasoning",
    "stream_tool_calls",
]


class _NotChecked:
    def __repr__(self) -> str:
        return "NOT_CHECKED"


NOT_CHECKED: Any = _NotChecked()
"""Default of the ``expected_*`` fields: that part of the result is not compared."""


@dataclass(frozen=True)
class ToolTranscript:
    """A model output for a tool parser, with the request's tools and optional expectations.

    ``expected_calls`` is a list of ``(name, arguments dict)``; ``expected_content`` is the
    non-streaming content (``None`` and ``""`` compare equal).
    """

    text: str
    tools: list[dict[str, Any]] | None = None
    expected_calls: Any = NOT_CHECKED
    expected_content: Any = NOT_CHECKED
    label: str = ""


@dataclass(frozen=True)
class ReasoningTranscript:
    """A model output for a reasoning parser, with optional expected results."""

    text: str
    expected_reasoning: Any = NOT_CHECKED
    expected_content: Any = NOT_CHECKED
    label: str = ""


@dataclass
class StreamedToolCalls:
    """What a client assembles from a tool parser's stream."""

    content: str = ""
    calls: list[tuple[str, str, str]] = field(default_factory=list)  # (id, name, arguments)


@dataclass
class StreamedReasoning:
    """What a client assembles from a reasoning parser's stream."""

    reasoning: str = ""
    content: str = ""


# --------------------------------------------------------------------------- splitting


def split_at(text: str, cut_points: Sequence[int]) -> list[str]:
    """``text`` cut at the sorted ``cut_points`` (repeated points give empty chunks)."""
    bounds = [0, *sorted(cut_points), len(text)]
    return [text[a:b] for a, b in zip(bounds[:-1], bounds[1:], strict=True)]


def iter_splits(text: str, seed: int = 0, num_random: int = 16) -> Iterator[list[str]]:
    """Every way the suite feeds ``text``: whole, each single split point, one character
    per chunk, and ``num_random`` random multi-splits (with empty chunks)."""
    yield [text]
    for point in range(len(text) + 1):
        yield split_at(text, [point])
    yield list(text) or [""]
    rng = random.Random(seed)
    for _ in range(num_random):
        num_cuts = rng.randint(1, max(1, len(text) // 2))
        yield split_at(text, [rng.randint(0, len(text)) for _ in range(num_cuts)])


# --------------------------------------------------------------------------- malformed input

_NOISE = list("{}[]\"':,;<>/\\=()\n\t -") + [
    "null",
    "true",
    "1e999",
    "é",
    "你好",
    "🙂",
    "\x00",
    "\ufffd",
]


def malformed_variants(texts: Sequence[str], seed: int = 0, count: int = 48) -> list[str]:
    """Broken outputs built from ``texts`` with a fixed seed: truncations, mutations
    (a span deleted, repeated or moved) and random strings of fragments and noise."""
    rng = random.Random(seed)
    sources = [text for text in texts if text] or ["<x>{}</x>"]
    variants: list[str] = []
    for index in range(count):
        text = sources[index % len(sources)]
        kind = index % 4
        if kind == 0:
            variants.append(text[: rng.randint(0, len(text) - 1)])
        elif kind == 1:
            a, b = sorted(rng.randint(0, len(text)) for _ in range(2))
            variants.append(text[:a] + text[b:] if rng.random() < 0.5 else text[:b] + text[a:])
        elif kind == 2:
            a, b = sorted(rng.randint(0, len(text)) for _ in range(2))
            c = rng.randint(0, len(text) - (b - a))
            rest = text[:a] + text[b:]
            variants.append(rest[:c] + text[a:b] + rest[c:])
        else:
            parts = []
            for _ in range(rng.randint(1, 24)):
                if rng.random() < 0.4:
                    source = rng.choice(sources)
                    a = rng.randint(0, len(source) - 1)
                    parts.append(source[a : a + rng.randint(1, 12)])
                elif rng.random() < 0.8:
                    parts.append(rng.choice(_NOISE))
                else:
                    raw = bytes(rng.randint(0, 255) for _ in range(rng.randint(1, 8)))
                    parts.append(raw.decode("utf-8", errors="replace"))
            variants.append("".join(parts))
    return variants


# --------------------------------------------------------------------------- streaming


def stream_tool_calls(
    parser: ToolParser, chunks: Sequence[str], tools: list[dict[str, Any]] | None = None
) -> StreamedToolCalls:
    """Feed ``chunks`` to ``parser`` as the server does and assemble the client's view.

    Raises ``AssertionError`` when the deltas break the OpenAI streaming protocol.
    """
    result = StreamedToolCalls()
    previous = ""
    for chunk in chunks:
        current = previous + chunk
        _collect_tool_delta(
            result, parser.extract_tool_calls_streaming(previous, current, chunk, tools)
        )
        previous = current
    _collect_tool_delta(result, parser.finish_streaming(previous))
    return result


def _collect_tool_delta(result: StreamedToolCalls, delta: DeltaMessage | None) -> None:
    if delta is None:
        return
    assert isinstance(delta, DeltaMessage), f"expected a DeltaMessage or None, got {delta!r}"
    assert not delta.reasoning_content, "a tool parser must not emit reasoning_content"
    result.content += delta.content or ""
    for piece in delta.tool_calls:
        if piece.index == len(result.calls):
            assert piece.id and piece.name, (
                f"the first delta of tool call {piece.index} must carry its id and name, got "
                f"{piece!r}"
            )
            assert piece.id not in {call[0] for call in result.calls}, (
                f"tool call {piece.index} reuses the id {piece.id!r} of an earlier call"
            )
            result.calls.append((piece.id, piece.name, piece.arguments or ""))
            continue
        assert 0 <= piece.index < len(result.calls), (
            f"tool call delta index {piece.index} skips ahead: {len(result.calls)} calls so far "
            "(indices start at 0 and grow by one)"
        )
        call_id, name, arguments = result.calls[piece.index]
        assert piece.id in (None, call_id), f"call {piece.index} changed its id to {piece.id!r}"
        assert piece.name in (None, name), f"call {piece.index} changed its name: {piece!r}"
        result.calls[piece.index] = (call_id, name, arguments + (piece.arguments or ""))


def stream_reasoning(parser: ReasoningParser, chunks: Sequence[str]) -> StreamedReasoning:
    """Feed ``chunks`` to a reasoning parser and assemble reasoning and content."""
    result = StreamedReasoning()
    previous = ""
    deltas = []
    for chunk in chunks:
        current = previous + chunk
        deltas.append(parser.extract_reasoning_streaming(previous, current, chunk))
        previous = current
    deltas.append(parser.finish_streaming(previous))
    for delta in deltas:
        if delta is None:
            continue
        assert isinstance(delta, DeltaMessage), f"expected a DeltaMessage or None: {delta!r}"
        assert not delta.tool_calls, "a reasoning parser must not emit tool calls"
        result.reasoning += delta.reasoning_content or ""
        result.content += delta.content or ""
    return result


# --------------------------------------------------------------------------- tool parsers


def _describe(label: str, text: str, chunks: Sequence[str] | None = None) -> str:
    where = f"transcript {label!r}: " if label else ""
    shown = text if len(text) <= 300 else text[:300] + "..."
    message = f"{where}output {shown!r}"
    return message if chunks is None else f"{message}\nchunks {list(chunks)!r}"


@contextmanager
def _no_exceptions(label: str, text: str) -> Iterator[None]:
    """Turn an exception from the parser into a test failure that shows the output."""
    try:
        yield
    except AssertionError:
        raise
    except Exception as exc:
        raise AssertionError(
            f"the parser raised {type(exc).__name__}: {exc}; unexpected or malformed output "
            f"must come back as content, never as an exception\n{_describe(label, text)}"
        ) from exc


def _tool_reference(
    parser_cls: Callable[[], ToolParser], text: str, tools: list[dict[str, Any]] | None
) -> tuple[str, list[tuple[str, str]]]:
    result = parser_cls().extract_tool_calls(text, tools)
    ids = [call.id for call in result.tool_calls]
    assert all(ids) and len(set(ids)) == len(ids), f"tool call ids must be unique: {ids}"
    for call in result.tool_calls:
        assert isinstance(call.arguments, str), "arguments must be a JSON string"
        assert isinstance(json.loads(call.arguments), dict), (
            f"arguments of {call.name!r} must be a JSON object, got {call.arguments!r}"
        )
    assert result.tools_called == bool(result.tool_calls)
    return result.content or "", [(call.name, call.arguments) for call in result.tool_calls]


def _check_tool_splits(
    parser_cls: Callable[[], ToolParser],
    transcript: ToolTranscript,
    splits: Iterator[list[str]],
) -> tuple[str, list[tuple[str, str]]]:
    text, tools = transcript.text, transcript.tools
    with _no_exceptions(transcript.label, text):
        content, calls = _tool_reference(parser_cls, text, tools)
    for chunks in splits:
        try:
            with _no_exceptions(transcript.label, text):
                streamed = stream_tool_calls(parser_cls(), chunks, tools)
        except AssertionError as exc:
            raise AssertionError(f"{exc}\n{_describe(transcript.label, text, chunks)}") from None
        streamed_calls = [(name, arguments) for _, name, arguments in streamed.calls]
        # A parser that streams unfinished calls has one extra, partial, call in the stream
        # of an output cut off inside a call (the tool_parser module docstring).
        cut_off_call = (
            getattr(parser_cls, "streams_partial_calls", False)
            and len(streamed_calls) == len(calls) + 1
            and streamed_calls[:-1] == calls
        )
        assert streamed.content == content and (streamed_calls == calls or cut_off_call), (
            "streaming differs from non-streaming\n"
            f"non-streaming: content={content!r} calls={calls!r}\n"
            f"streaming:     content={streamed.content!r} calls={streamed_calls!r}\n"
            + _describe(transcript.label, text, chunks)
        )
    return content, calls


def _check_tool_expectations(
    transcript: ToolTranscript, content: str, calls: list[tuple[str, str]]
) -> None:
    where = _describe(transcript.label, transcript.text)
    if transcript.expected_calls is not NOT_CHECKED:
        got = [(name, json.loads(arguments)) for name, arguments in calls]
        want = [(name, arguments) for name, arguments in transcript.expected_calls]
        assert got == want, f"tool calls {got!r}, expected {want!r}\n{where}"
    if transcript.expected_content is not NOT_CHECKED:
        want_content = transcript.expected_content or ""
        assert content == want_content, f"content {content!r}, expected {want_content!r}\n{where}"


def check_tool_parser(
    parser_cls: Callable[[], ToolParser],
    transcripts: Sequence[ToolTranscript | str],
    *,
    seed: int = 0,
    num_random_splits: int = 16,
    num_malformed: int = 48,
) -> None:
    """Run the whole tool-parser suite (see the module docstring); raise on the first failure."""
    items = [t if isinstance(t, ToolTranscript) else ToolTranscript(t) for t in transcripts]
    assert items, "give at least one transcript"
    for item in items:
        content, calls = _check_tool_splits(
            parser_cls, item, iter_splits(item.text, seed, num_random_splits)
        )
        _check_tool_expectations(item, content, calls)
    check_tool_parser_malformed(parser_cls, items, seed=seed, count=num_malformed)


def check_tool_parser_malformed(
    parser_cls: Callable[[], ToolParser],
    transcripts: Sequence[ToolTranscript],
    *,
    seed: int = 0,
    count: int = 48,
) -> None:
    """Broken outputs never raise, stream like they parse, and degrade to plain content."""
    tools = next((t.tools for t in transcripts if t.tools), None)
    texts = [t.text for t in transcripts]
    full_calls = {}
    for transcript in transcripts:
        with _no_exceptions(transcript.label, transcript.text):
            full_calls[transcript.text] = _tool_reference(
                parser_cls, transcript.text, transcript.tools
            )[1]
    rng = random.Random(seed)
    for text in malformed_variants(texts, seed, count):
        splits = [[text], list(text) or [""], split_at(text, [rng.randint(0, len(text))] * 2)]
        content, calls = _check_tool_splits(
            parser_cls, ToolTranscript(text, tools, label="malformed"), iter(splits)
        )
        if not calls:
            assert content == text, (
                "with no tool call found, the content must be the output unchanged, got "
                f"{content!r}\n{_describe('malformed', text)}"
            )
        for source, source_calls in full_calls.items():
            if source.startswith(text):
                assert calls == source_calls[: len(calls)], (
                    f"a truncated output has calls {calls!r} that the whole output "
                    f"{source!r} does not start with ({source_calls!r})"
                )


# --------------------------------------------------------------------------- reasoning parsers


def _check_reasoning_splits(
    parser_cls: Callable[[], ReasoningParser],
    transcript: ReasoningTranscript,
    splits: Iterator[list[str]],
) -> tuple[str, str]:
    text = transcript.text
    with _no_exceptions(transcript.label, text):
        reasoning, content = parser_cls().extract_reasoning(text)
    for part, what in ((reasoning, "reasoning"), (content, "content")):
        assert part is None or isinstance(part, str), f"{what} must be str or None: {part!r}"
        assert part is None or part in text, (
            f"{what} {part!r} is not a part of the output\n{_describe(transcript.label, text)}"
        )
    reasoning, content = reasoning or "", content or ""
    for chunks in splits:
        try:
            with _no_exceptions(transcript.label, text):
                streamed = stream_reasoning(parser_cls(), chunks)
        except AssertionError as exc:
            raise AssertionError(f"{exc}\n{_describe(transcript.label, text, chunks)}") from None
        assert (streamed.reasoning, streamed.content) == (reasoning, content), (
            "streaming differs from non-streaming\n"
            f"non-streaming: reasoning={reasoning!r} content={content!r}\n"
            f"streaming:     reasoning={streamed.reasoning!r} content={streamed.content!r}\n"
            + _describe(transcript.label, text, chunks)
        )
    return reasoning, content


def _check_reasoning_end(parser_cls: Callable[[], ReasoningParser], text: str) -> None:
    parser = parser_cls()
    ended = False
    for end in range(len(text) + 1):
        with _no_exceptions("is_reasoning_end", text[:end]):
            now = parser.is_reasoning_end(text[:end])
        assert isinstance(now, bool), f"is_reasoning_end must return a bool, got {now!r}"
        assert now or not ended, (
            f"is_reasoning_end is True for {text[: end - 1]!r} but False for the longer "
            f"{text[:end]!r}; once the think section ended it stays ended"
        )
        ended = now


def check_reasoning_parser(
    parser_cls: Callable[[], ReasoningParser],
    transcripts: Sequence[ReasoningTranscript | str],
    *,
    seed: int = 0,
    num_random_splits: int = 16,
    num_malformed: int = 48,
) -> None:
    """Run the whole reasoning-parser suite; raise on the first failure."""
    items = [
        t if isinstance(t, ReasoningTranscript) else ReasoningTranscript(t) for t in transcripts
    ]
    assert items, "give at least one transcript"
    for item in items:
        reasoning, content = _check_reasoning_splits(
            parser_cls, item, iter_splits(item.text, seed, num_random_splits)
        )
        where = _describe(item.label, item.text)
        if item.expected_reasoning is not NOT_CHECKED:
            want = item.expected_reasoning or ""
            assert reasoning == want, f"reasoning {reasoning!r}, expected {want!r}\n{where}"
        if item.expected_content is not NOT_CHECKED:
            want = item.expected_content or ""
            assert content == want, f"content {content!r}, expected {want!r}\n{where}"
        _check_reasoning_end(parser_cls, item.text)
    check_reasoning_parser_malformed(parser_cls, items, seed=seed, count=num_malformed)


def check_reasoning_parser_malformed(
    parser_cls: Callable[[], ReasoningParser],
    transcripts: Sequence[ReasoningTranscript],
    *,
    seed: int = 0,
    count: int = 48,
) -> None:
    """Broken outputs (unbalanced tags, garbage) never raise and stream like they parse."""
    rng = random.Random(seed)
    for text in malformed_variants([t.text for t in transcripts], seed, count):
        splits = [[text], list(text) or [""], split_at(text, [rng.randint(0, len(text))] * 2)]
        transcript = ReasoningTranscript(text, label="malformed")
        _check_reasoning_splits(parser_cls, transcript, iter(splits))
        _check_reasoning_end(parser_cls, text)


# --------------------------------------------------------------------------- pytest classes


class ToolParserConformance:
    """Subclass as ``Test...`` with ``parser_cls`` and ``transcripts`` set; pytest runs it."""

    parser_cls: ClassVar[Callable[[], ToolParser]]
    transcripts: ClassVar[Sequence[ToolTranscript | str]]
    seed: ClassVar[int] = 0

    def _items(self) -> list[ToolTranscript]:
        return [t if isinstance(t, ToolTranscript) else ToolTranscript(t) for t in self.transcripts]

    def test_streaming_matches_non_streaming(self) -> None:
        for item in self._items():
            content, calls = _check_tool_splits(
                type(self).parser_cls, item, iter_splits(item.text, self.seed)
            )
            _check_tool_expectations(item, content, calls)

    def test_malformed_output_degrades_to_content(self) -> None:
        check_tool_parser_malformed(type(self).parser_cls, self._items(), seed=self.seed)


class ReasoningParserConformance:
    """Subclass as ``Test...`` with ``parser_cls`` and ``transcripts`` set; pytest runs it."""

    parser_cls: ClassVar[Callable[[], ReasoningParser]]
    transcripts: ClassVar[Sequence[ReasoningTranscript | str]]
    seed: ClassVar[int] = 0

    def _items(self) -> list[ReasoningTranscript]:
        return [
            t if isinstance(t, ReasoningTranscript) else ReasoningTranscript(t)
            for t in self.transcripts
        ]

    def test_streaming_matches_non_streaming(self) -> None:
        check_reasoning_parser(
            type(self).parser_cls, self._items(), seed=self.seed, num_malformed=0
        )

    def test_malformed_output_never_raises(self) -> None:
        check_reasoning_parser_malformed(type(self).parser_cls, self._items(), seed=self.seed)
