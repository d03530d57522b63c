"""DeepSeek-R1 style reasoning: the output starts inside the think section.

Splits as vLLM's ``deepseek_r1`` parser does:

- A ``<think>`` that opens the output (the model repeating the template's tag) is dropped,
  with the whitespace before it.
- With ``</think>``: the text before the first one is reasoning, the text after it is
  content (none when nothing follows).
- Without ``</think>``: the whole output is reasoning (generation stopped while thinking).
- No whitespace is stripped.

Also the right parser for QwQ and Qwen3 *-Thinking-2507 models, whose templates open
``<think>`` too. Streaming: every character streams as generated, except a partial tag at
the end (``</thi``) and, at the very start, what may still become the opening ``<think>``.
"""

from __future__ import annotations

from engine_reasoning.base import (
    SplitReasoningParser,
    after_start_tag,
    could_be_start_tag,
    split_at_end_tag,
    without_partial_end,
)


class DeepSeekR1ReasoningParser(SplitReasoningParser):
    name = "deepseek_r1"

    def split(self, text: str, final: bool) -> tuple[str | None, str | None]:
        if not final and could_be_start_tag(text):
            return None, None  # "<thi" may still be the repeated start tag
        body = after_start_tag(text)
        if body is None:
            body = text
        parts = split_at_end_tag(body)
        if parts is not None:
            return parts
        return (body if final else without_partial_end(body)), None
