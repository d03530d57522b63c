"""Shared streaming machinery: a parser only says how a text splits (see ``split``).

``split(text, final=True)`` is the non-streaming answer. ``split(text, final=False)`` is
the part of the answer that can no longer change whatever is generated next: a reasoning
prefix and a content prefix (only a partial tag at the end is left out, so every other
character streams as it is generated). Streaming sends the growth of those prefixes, so
the concatenated deltas equal the non-streaming result for any split of the output into
chunks.
"""

from __future__ import annotations

from abc import abstractmethod
from typing import Any

from engine_sdk.interfaces.messages import DeltaMessage
from engine_sdk.interfaces.reasoning_parser import ReasoningParser

THINK_START = "<think>"
THINK_END = "</think>"


class SplitReasoningParser(ReasoningParser):
    """A ``ReasoningParser`` defined by :meth:`split`; one instance per request."""

    def __init__(self, tokenizer: Any = None) -> None:
        super().__init__(tokenizer)
        self._sent_reasoning = ""
        self._sent_content = ""

    @abstractmethod
    def split(self, text: str, final: bool) -> tuple[str | None, str | None]:
        """``(reasoning, content)``; when not final, the prefixes that are decided."""

    def extract_reasoning(self, model_output: str) -> tuple[str | None, str | None]:
        reasoning, content = self.split(model_output, final=True)
        return reasoning or None, content or None

    def extract_reasoning_streaming(
        self, previous_text: str, current_text: str, delta_text: str
    ) -> DeltaMessage | None:
        return self._advance(current_text, final=False)

    def finish_streaming(self, current_text: str) -> DeltaMessage | None:
        return self._advance(current_text, final=True)

    def is_reasoning_end(self, text: str) -> bool:
        return THINK_END in text

    def _advance(self, text: str, final: bool) -> DeltaMessage | None:
        reasoning, content = self.split(text, final)
        delta = DeltaMessage()
        reasoning, content = reasoning or "", content or ""
        if len(reasoning) > len(self._sent_reasoning) and reasoning.startswith(
            self._sent_reasoning
        ):
            delta.reasoning_content = reasoning[len(self._sent_reasoning) :]
            self._sent_reasoning = reasoning
        if len(content) > len(self._sent_content) and content.startswith(self._sent_content):
            delta.content = content[len(self._sent_content) :]
            self._sent_content = content
        return None if delta.is_empty() else delta


def without_partial_end(text: str, markers: tuple[str, ...] = (THINK_END,)) -> str:
    """``text`` minus a suffix that could grow into one of ``markers`` (by default
    ``</think>``: ``"abc</th"`` -> ``"abc"``)."""
    cut = len(text)
    for marker in markers:
        for length in range(min(len(marker) - 1, len(text)), 0, -1):
            if text.endswith(marker[:length]):
                cut = min(cut, len(text) - length)
                break
    return text[:cut]


def split_at_end_tag(body: str) -> tuple[str, str | None] | None:
    """``(reasoning, content)`` around the first ``</think>`` of ``body`` (as vLLM: no
    whitespace stripped, ``None`` content when nothing follows the tag); None without it."""
    end = body.find(THINK_END)
    if end < 0:
        return None
    return body[:end], body[end + len(THINK_END) :] or None


def after_start_tag(text: str) -> str | None:
    """The text after a ``<think>`` that opens ``text`` (after whitespace), else ``None``."""
    stripped = text.lstrip()
    return stripped[len(THINK_START) :] if stripped.startswith(THINK_START) else None


def could_be_start_tag(text: str) -> bool:
    """Whether ``text`` is only whitespace and/or the beginning of ``<think>`` so far."""
    stripped = text.lstrip()
    return len(stripped) < len(THINK_START) and THINK_START.startswith(stripped)
