"""DeepSeek-R1 style reasoning: the output starts inside the think section.

The chat template opens ``<think>`` in the prompt, so everything before ``</think>`` is
reasoning (a ``<think>`` the model repeats at the start is dropped) and everything after it
is content. Whitespace around the reasoning and before the content is dropped, as the
template does when it renders the turn back. Without ``</think>`` the whole output is
reasoning (generation stopped while thinking). Also the right parser for QwQ and Qwen3
*-Thinking-2507 models, whose templates open ``<think>`` too.
"""

from __future__ import annotations

from engine_reasoning.base import (
    THINK_END,
    SplitReasoningParser,
    after_start_tag,
    could_be_start_tag,
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
        end = body.find(THINK_END)
        if end >= 0:
            return body[:end].strip(), body[end + len(THINK_END) :].lstrip()
        return (body if final else without_partial_end(body)).strip(), None
