"""Incremental detokenization: turn a growing list of token ids into text deltas.

Decoding one token at a time is wrong for two reasons: a character can span several
tokens (byte-level BPE splits an emoji into up to four byte tokens, SentencePiece byte
fallback does the same) and some decoders change a token's text depending on its left
neighbour (the leading-space rule of SentencePiece). So each step decodes a short window
of ids that starts a little before the new tokens and keeps only what the new tokens add:

    ids:   ... p p p p | r r r | n n
                ^prefix_offset  ^read_offset (first id not yet turned into text)

    prefix_text = decode(ids[prefix_offset:read_offset])
    full_text   = decode(ids[prefix_offset:])
    delta       = full_text[len(prefix_text):]

If ``full_text`` ends in U+FFFD, the last character is still incomplete: nothing is
emitted and the ids stay unread until a later token completes it. Once text is emitted the
window slides: ``prefix_offset = read_offset`` and ``read_offset = len(ids)``.
"""

from __future__ import annotations

import os
from typing import Any

_REPLACEMENT_CHAR = "\ufffd"
# How many prompt tokens to decode as left context before the first output token.
_INITIAL_CONTEXT_TOKENS = 5
_MAX_BYTES_PER_CHAR = 4


class IncrementalDetokenizer:
    """Decode one sequence's output tokens into text, a delta at a time."""

    def __init__(
        self,
        tokenizer: Any,
        prompt_token_ids: list[int],
        skip_special_tokens: bool = True,
    ) -> None:
        self._tokenizer = tokenizer
        self._skip_special_tokens = skip_special_tokens
        self._token_ids: list[int] = list(prompt_token_ids)
        # If the prompt ends inside a character, the ids that start it are not "read" yet:
        # the first output token completes the character and the delta carries it whole.
        # (A UTF-8 character has at most 4 bytes, so at most 3 ids are given back.)
        read_offset = len(self._token_ids)
        for _ in range(_MAX_BYTES_PER_CHAR - 1):
            start = self._clean_start(read_offset)
            if read_offset == 0 or not self._decode(start, read_offset).endswith(_REPLACEMENT_CHAR):
                break
            read_offset -= 1
        self._read_offset = read_offset
        self._prefix_offset = self._clean_start(read_offset)
        self.output_text = ""

    def _clean_start(self, end: int) -> int:
        """A context start near ``end - 5`` that is not inside a character.

        Starting mid-character decodes to U+FFFD, and byte-fallback decoders then turn the
        whole run of byte tokens into U+FFFD, so the window must start on a boundary.
        """
        first = max(end - _INITIAL_CONTEXT_TOKENS, 0)
        for start in range(first, max(first - 2 * _MAX_BYTES_PER_CHAR, 0) - 1, -1):
            if not self._decode(start, end).startswith(_REPLACEMENT_CHAR):
                return start
        return first

    def _decode(self, start: int, end: int | None = None) -> str:
        text: str = self._tokenizer.decode(
            self._token_ids[start:end],
            skip_special_tokens=self._skip_special_tokens,
            clean_up_tokenization_spaces=False,
        )
        return text

    def update(self, new_token_ids: list[int]) -> str:
        """Append ``new_token_ids``; return the text they complete (possibly "")."""
        self._token_ids.extend(new_token_ids)
        return self._advance(final=False)

    def flush(self) -> str:
        """Return text still held back (an incomplete character at the end of a sequence)."""
        return self._advance(final=True)

    def _advance(self, final: bool) -> str:
        if self._read_offset >= len(self._token_ids):
            return ""
        prefix_text = self._decode(self._prefix_offset, self._read_offset)
        full_text = self._decode(self._prefix_offset)
        if not final and full_text.endswith(_REPLACEMENT_CHAR):
            return ""
        if full_text.startswith(prefix_text):
            delta = full_text[len(prefix_text) :]
        else:
            # The decoder rewrote the left context (rare normalizing decoders): fall back to
            # the longest common prefix so nothing already emitted is repeated.
            delta = full_text[len(os.path.commonprefix([prefix_text, full_text])) :]
        self._prefix_offset = self._read_offset
        self._read_offset = len(self._token_ids)
        self.output_text += delta
        return delta
