"""Qwen3 reasoning: ``<think>...</think>`` opened by the model itself.

- With ``</think>``: the text before it is reasoning (from after the first ``<think>`` if
  there is one; text before that tag is dropped), the text after it is content.
- Without ``</think>``: if the output opens with ``<think>`` (generation stopped while
  thinking) the rest is reasoning; otherwise the whole output is content (thinking off).
- Whitespace around the reasoning and before the content that follows ``</think>`` is
  dropped, as the template does when it renders the turn back.

Streaming: after an opening ``<think>`` reasoning streams at once. An output that does not
open with ``<think>`` is undecided until ``</think>`` appears (then what came before is
reasoning) or generation ends (then it is all content), and is held back until then. With
``enable_thinking=False`` the template closes the think block in the prompt; the server
should then not use a reasoning parser at all (see docs/plugins/parsers.md).
"""

from __future__ import annotations

from engine_reasoning.base import (
    THINK_END,
    THINK_START,
    SplitReasoningParser,
    after_start_tag,
    without_partial_end,
)


class Qwen3ReasoningParser(SplitReasoningParser):
    name = "qwen3"

    def split(self, text: str, final: bool) -> tuple[str | None, str | None]:
        end = text.find(THINK_END)
        if end >= 0:
            before = text[:end]
            start = before.find(THINK_START)
            reasoning = before[start + len(THINK_START) :] if start >= 0 else before
            return reasoning.strip(), text[end + len(THINK_END) :].lstrip()
        body = after_start_tag(text)
        if body is not None:
            return (body if final else without_partial_end(body)).strip(), None
        return (None, text) if final else (None, None)
