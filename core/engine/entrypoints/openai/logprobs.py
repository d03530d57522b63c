"""Engine ``Logprobs`` records -> the chat and the completions logprobs formats.

Chat: ``{"content": [{"token", "logprob", "bytes", "top_logprobs": [...]}]}``.
Completions: ``{"tokens", "token_logprobs", "top_logprobs", "text_offset"}``, where
``top_logprobs[i]`` maps token text to logprob and ``text_offset[i]`` is where token ``i``
starts in the returned text.
"""

from __future__ import annotations

import functools
import math
import re
from collections.abc import Sequence
from typing import Any

from engine.entrypoints.openai.protocol import (
    ChatLogprobs,
    ChatTokenLogprob,
    CompletionLogprobs,
    TopLogprob,
)
from engine.outputs import Logprobs


@functools.cache
def _byte_decoder() -> dict[str, int]:
    """GPT-2 byte-level BPE: the printable stand-in character of each byte -> the byte."""
    keep = list(range(ord("!"), ord("~") + 1)) + list(range(0xA1, 0xAD)) + list(range(0xAE, 256))
    chars = keep[:]
    extra = 0
    for b in range(256):
        if b not in keep:
            keep.append(b)
            chars.append(256 + extra)
            extra += 1
    return {chr(c): b for b, c in zip(keep, chars, strict=True)}


class TokenText:
    """Token id -> text and raw bytes, cached per request (decoding one id is slow).

    A token can hold part of a UTF-8 character; its text then shows U+FFFD, while its
    bytes are the real ones (from the byte-level piece or a SentencePiece ``<0xNN>``).
    """

    def __init__(self, tokenizer: Any) -> None:
        self.tokenizer = tokenizer
        self._cache: dict[int, str] = {}
        self._bytes: dict[int, bytes] = {}

    def __call__(self, token_id: int) -> str:
        text = self._cache.get(token_id)
        if text is None:
            text = self.tokenizer.decode([token_id])
            self._cache[token_id] = text
        return text

    def bytes_of(self, token_id: int) -> list[int]:
        raw = self._bytes.get(token_id)
        if raw is None:
            raw = self._raw_bytes(token_id)
            self._bytes[token_id] = raw
        return list(raw)

    def _raw_bytes(self, token_id: int) -> bytes:
        text = self(token_id)
        if "\ufffd" not in text:
            return text.encode()
        piece = self.tokenizer.convert_ids_to_tokens(token_id)
        if isinstance(piece, str):
            match = re.fullmatch(r"<0x([0-9A-Fa-f]{2})>", piece)
            if match:
                return bytes([int(match.group(1), 16)])
            decoder = _byte_decoder()
            if piece and all(c in decoder for c in piece):
                return bytes(decoder[c] for c in piece)
        return text.encode()


def _finite(value: float) -> float:
    # JSON has no -inf; clients expect a very negative number instead.
    return value if math.isfinite(value) else -9999.0


def chat_logprobs(entries: Sequence[Logprobs], text_of: TokenText, num_top: int) -> ChatLogprobs:
    content = []
    for lp in entries:
        token = text_of(lp.token_id)
        tops = [
            TopLogprob(token=text_of(tid), logprob=_finite(v), bytes=text_of.bytes_of(tid))
            for tid, v in list(zip(lp.top_token_ids, lp.top_logprobs, strict=False))[:num_top]
        ]
        content.append(
            ChatTokenLogprob(
                token=token,
                logprob=_finite(lp.logprob),
                bytes=text_of.bytes_of(lp.token_id),
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
