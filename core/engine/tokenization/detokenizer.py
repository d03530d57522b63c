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

If ``full_text`` ends in U+FFFD, the last character is still incomplete, and if it is no
longer than ``prefix_text`` the new ids added no text (a skipped special token): either
way nothing is emitted and the window stays, keeping its left context, until a later
token adds text. Once text is emitted the window slides: ``prefix_offset = read_offset``
and ``read_offset = len(ids)``.

This is exactly the algorithm of ``tokenizers.decoders.DecodeStream``, which runs it in
Rust with one call per step. A transformers fast tokenizer with the stock ``decode`` gets
that path (decoding costs a few microseconds, with no Python tokenizer overhead); any
other tokenizer, and a stream whose decoder rewrote earlier text (DecodeStream refuses to
go on), use the same algorithm here in Python.

``defer=True`` (a request whose text nobody reads before it finishes: one output at the
end, no stop strings) skips the per-step work: ``update`` only appends the ids and returns
"", and ``flush`` decodes the whole window ``ids[prefix_offset:]`` at once, the same
algorithm over one larger window (one Rust decode per request instead of one step per
token: the offline ``LLM`` at batch 256 spent about 1 ms of host time a step here).
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
        defer: bool = False,
    ) -> None:
        self._tokenizer = tokenizer
        self._defer = defer
        self._skip_special_tokens = skip_special_tokens
        self._backend = rust_backend(tokenizer)
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
        self._deltas: list[str] = []  # joined on demand: += would copy the text each step
        # deferred: flush decodes in Python over one window, so no stream is started
        self._stream = None if defer else self._start_stream()
        self._num_streamed = read_offset  # ids the stream has been given

    @property
    def output_text(self) -> str:
        """All text emitted so far."""
        if len(self._deltas) > 1:
            self._deltas = ["".join(self._deltas)]
        return self._deltas[0] if self._deltas else ""

    def _start_stream(self) -> Any:
        """A DecodeStream holding the window ``ids[prefix_offset:read_offset]`` as read,
        or None (a tokenizer without a Rust backend, or an old ``tokenizers``)."""
        if self._backend is None:
            return None
        try:
            from tokenizers.decoders import DecodeStream
        except ImportError:  # tokenizers < 0.21
            return None
        stream = DecodeStream(skip_special_tokens=self._skip_special_tokens)
        window = self._token_ids[self._prefix_offset : self._read_offset]
        if window:
            # One step over the whole window. When it decodes to text without a trailing
            # U+FFFD (the offsets are chosen so) the stream reads all of it, and its state
            # is (window, prefix text = decode(window)), the same as ours; when it decodes
            # to "" the stream keeps it unread with prefix "", which is the same too.
            try:
                read = stream.step(self._backend, window)
            except Exception:  # noqa: BLE001 - tokenizers < 0.22 steps one id at a time
                return None
            if read is None and self._decode(self._prefix_offset, self._read_offset):
                return None  # a prompt ending in broken bytes: the Python path handles it
        return stream

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
        ids = self._token_ids[start:end]
        if self._backend is not None:
            backend_text: str = self._backend.decode(
                ids, skip_special_tokens=self._skip_special_tokens
            )
            return backend_text
        text: str = self._tokenizer.decode(
            ids,
            skip_special_tokens=self._skip_special_tokens,
            clean_up_tokenization_spaces=False,
        )
        return text

    def update(self, new_token_ids: list[int]) -> str:
        """Append ``new_token_ids``; return the text they complete (possibly "")."""
        if not new_token_ids:
            return ""
        self._token_ids.extend(new_token_ids)
        if self._defer:  # decoded by flush, all at once
            return ""
        stream = self._stream
        if stream is None:
            return self._advance(final=False)
        num_streamed = self._num_streamed
        self._num_streamed = len(self._token_ids)
        if num_streamed + 1 == self._num_streamed:
            step_ids: int | list[int] = new_token_ids[-1]
        else:  # several new ids, or prompt ids held back (a character the prompt began)
            step_ids = self._token_ids[num_streamed:]
        try:
            delta = stream.step(self._backend, step_ids)
        except Exception:  # noqa: BLE001 - the decoder rewrote emitted text (InvalidPrefix)
            # Our offsets still describe the stream's state before this step: go on in Python.
            self._stream = None
            return self._advance(final=False)
        if delta is None:
            return ""
        self._prefix_offset = self._read_offset
        self._read_offset = len(self._token_ids)
        self._deltas.append(delta)
        text: str = delta
        return text

    def flush(self) -> str:
        """Return text still held back (an incomplete character at the end of a sequence)."""
        self._stream = None  # its state is ours; the Python path emits what it holds back
        return self._advance(final=True)

    def _advance(self, final: bool) -> str:
        if self._read_offset >= len(self._token_ids):
            return ""
        prefix_text = self._decode(self._prefix_offset, self._read_offset)
        full_text = self._decode(self._prefix_offset)
        if full_text.startswith(prefix_text):
            grew = len(full_text) > len(prefix_text)
            delta = full_text[len(prefix_text) :]
        else:
            # The decoder rewrote the left context (rare normalizing decoders): fall back to
            # the longest common prefix so nothing already emitted is repeated. ("Grew" is
            # measured in UTF-8 bytes, as DecodeStream does.)
            grew = len(full_text.encode()) > len(prefix_text.encode())
            delta = full_text[len(os.path.commonprefix([prefix_text, full_text])) :]
        if not final and (not grew or full_text.endswith(_REPLACEMENT_CHAR)):
            return ""
        self._prefix_offset = self._read_offset
        self._read_offset = len(self._token_ids)
        self._deltas.append(delta)
        return delta


def rust_backend(tokenizer: Any) -> Any:
    """The ``tokenizers.Tokenizer`` behind a transformers fast tokenizer whose ``decode`` is
    the stock one (a Rust decode, then an optional clean-up we never ask for), else None.

    A subclass that overrides ``decode`` or ``_decode`` may post-process the text, so it
    keeps going through its own ``decode``.
    """
    try:
        from tokenizers import Tokenizer
        from transformers import PreTrainedTokenizerFast
    except ImportError:
        return None
    if not isinstance(tokenizer, PreTrainedTokenizerFast):
        return None
    cls = type(tokenizer)
    if cls.decode is not PreTrainedTokenizerFast.decode:
        return None
    if cls._decode is not PreTrainedTokenizerFast._decode:
        return None
    backend = getattr(tokenizer, "backend_tokenizer", None)
    return backend if isinstance(backend, Tokenizer) else None
