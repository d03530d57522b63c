"""Engine ``Logprobs`` records -> the chat and the completions logprobs formats.

Chat: ``{"content": [{"token", "logprob", "bytes", "top_logprobs": [...]}]}``.
Completions: ``{"tokens", "token_logprobs", "top_logprobs", "text_offset"}``, where
``top_logprobs[i]`` maps token text to logprob and ``text_offset[i]`` is where token ``i``
starts in the returned text.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

from engine.core.scheduler_output import Logprobs
from engine.entrypoints.openai.protocol import (
    ChatLogprobs,
    ChatTokenLogprob,
    CompletionLogprobs,
    TopLogprob,
)


class TokenText:
    """Token id -> text, cached per request (tokenizers decode one id slowly)."""

    def __init__(self, tokenizer: Any) -> None:
        self.tokenizer = tokenizer
        self._cache: dict[int, str] = {}

    def __call__(self, token_id: int) -> str:
        text = self._cache.get(token_id)
        if text is None:
            text = self.tokenizer.decode([token_id])
            self._cache[token_id] = text
        return text


def _finite(value: float) -> float:
    # JSON has no -inf; clients expect a very negative number instead.
    return value if math.isfinite(value) else -9999.0


def chat_logprobs(entries: Sequence[Logprobs], text_of: TokenText, num_top: int) -> ChatLogprobs:
    content = []
    for lp in entries:
        token = text_of(lp.token_id)
        tops = [
            TopLogprob(token=text_of(tid), logprob=_finite(v), bytes=list(text_of(tid).encode()))
            for tid, v in list(zip(lp.top_token_ids, lp.top_logprobs, strict=False))[:num_top]
        ]
        content.append(
            ChatTokenLogprob(
                token=token,
                logprob=_finite(lp.logprob),
                bytes=list(token.encode()),
                top_logprobs=tops,
            )
        )
    return ChatLogprobs(content=content)


def completion_logprobs(
    entries: Sequence[Logprobs | None],
    token_ids: Sequence[int],
    text_of: TokenText,
    num_top: int,
    start_offset: int = 0,
) -> CompletionLogprobs:
    """``entries[i]`` belongs to ``token_ids[i]``; ``None`` (first prompt token) has none."""
    out = CompletionLogprobs()
    offset = start_offset
    for tid, lp in zip(token_ids, entries, strict=False):
        token = text_of(tid)
        out.tokens.append(token)
        out.text_offset.append(offset)
        offset += len(token)
        if lp is None:
            out.token_logprobs.append(None)
            out.top_logprobs.append(None)
            continue
        out.token_logprobs.append(_finite(lp.logprob))
        tops: dict[str, float] = {}
        for top_id, value in list(zip(lp.top_token_ids, lp.top_logprobs, strict=False))[:num_top]:
            tops.setdefault(text_of(top_id), _finite(value))
        tops.setdefault(token, _finite(lp.logprob))
        out.top_logprobs.append(tops)
    return out
