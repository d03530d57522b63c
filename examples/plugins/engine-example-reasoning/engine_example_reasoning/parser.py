"""A reasoning parser for outputs shaped ``<reasoning>...</reasoning>answer``.

Text before ``<reasoning>`` (usually whitespace) is content; an output without the start
tag is all content. In streaming, a tag split across chunks (``"<reas"`` + ``"oning>"``) is
held back until it is known whether it is a tag, so the concatenated deltas always equal
the non-streaming result.
"""

from __future__ import annotations

from engine_sdk.interfaces.messages import DeltaMessage
from engine_sdk.interfaces.reasoning_parser import ReasoningParser

START = "<reasoning>"
END = "</reasoning>"


def _split(text: str) -> tuple[str | None, str | None]:
    """``(reasoning, content)`` of a text so far; ``None`` for an empty part."""
    start = text.find(START)
    if start < 0:
        return None, text or None
    before = text[:start]
    rest = text[start + len(START) :]
    end = rest.find(END)
    if end < 0:
        return rest or None, before or None
    content = before + rest[end + len(END) :]
    return rest[:end] or None, content or None


def _held_back(text: str) -> int:
    """How many trailing characters could be the beginning of a tag still to come."""
    longest = 0
    for tag in (START, END):
        for size in range(min(len(tag) - 1, len(text)), longest, -1):
            if text.endswith(tag[:size]):
                longest = size
                break
    return longest


class TaggedReasoningParser(ReasoningParser):
    """``<reasoning>`` ... ``</reasoning>``: the inside is ``reasoning_content``."""

    name = "tagged_reasoning"

    def extract_reasoning(self, model_output: str) -> tuple[str | None, str | None]:
        return _split(model_output)

    def is_reasoning_end(self, text: str) -> bool:
        start = text.find(START)
        return start >= 0 and text.find(END, start + len(START)) >= 0

    def extract_reasoning_streaming(
        self, previous_text: str, current_text: str, delta_text: str
    ) -> DeltaMessage | None:
        # What was sent so far is the split of previous_text minus its held-back tail;
        # send the difference to the split of current_text minus its held-back tail.
        sent = self._stable_parts(previous_text)
        now = self._stable_parts(current_text)
        delta = DeltaMessage(
            reasoning_content=now[0][len(sent[0]) :] or None,
            content=now[1][len(sent[1]) :] or None,
        )
        return None if delta.is_empty() else delta

    def finish_streaming(self, current_text: str) -> DeltaMessage | None:
        sent = self._stable_parts(current_text)
        reasoning, content = _split(current_text)
        delta = DeltaMessage(
            reasoning_content=(reasoning or "")[len(sent[0]) :] or None,
            content=(content or "")[len(sent[1]) :] or None,
        )
        return None if delta.is_empty() else delta

    @staticmethod
    def _stable_parts(text: str) -> tuple[str, str]:
        stable = text[: len(text) - _held_back(text)]
        reasoning, content = _split(stable)
        return reasoning or "", content or ""
