"""Mistral tool calls after the ``[TOOL_CALLS]`` token, in either of its two forms.

    older (tokenizer v3..v7):  [TOOL_CALLS][{"name": "f", "arguments": {"x": 1}}, {...}]
    newer (v11+):              [TOOL_CALLS]f[ARGS]{"x": 1}[TOOL_CALLS]g[ARGS]{...}
                               (optionally f[CALL_ID]a1b2c3d4e[ARGS]{...})

``[TOOL_CALLS]`` is a special token: the server must detokenize with special tokens kept
(``requires_special_tokens``). Text before a marker is content; a marker followed by
something that is neither form stays in the content as written. Call ids are 9
alphanumeric characters, the only form Mistral chat templates accept back.
"""

from __future__ import annotations

import json
import random
import re
import string
from typing import Any, ClassVar

from engine_toolparsers.arguments import call_from_json, dump_arguments
from engine_toolparsers.base import PieceToolParser
from engine_toolparsers.pieces import (
    ParsedCall,
    Piece,
    call_piece,
    partial_marker_start,
    pending_piece,
    text_piece,
)

MARKER = "[TOOL_CALLS]"
ARGS = "[ARGS]"
CALL_ID = "[CALL_ID]"
_NAME = re.compile(r"[A-Za-z0-9_.\-]+")
_ID = re.compile(r"[A-Za-z0-9]+")
_ID_ALPHABET = string.ascii_letters + string.digits


class MistralToolParser(PieceToolParser):
    name = "mistral"
    requires_special_tokens: ClassVar[bool] = True

    def __init__(self, tokenizer: Any = None) -> None:
        super().__init__(tokenizer)
        self._decoder = json.JSONDecoder()
        self._rng = random.SystemRandom()

    def new_call_id(self) -> str:
        return "".join(self._rng.choice(_ID_ALPHABET) for _ in range(9))

    def split(self, text: str, final: bool, tools: list[dict[str, Any]] | None) -> list[Piece]:
        pieces: list[Piece] = []
        pos = 0
        while True:
            start = text.find(MARKER, pos)
            if start < 0:
                partial = None if final else partial_marker_start(text, (MARKER,), pos)
                pieces.append(text_piece(text[pos : len(text) if partial is None else partial]))
                if partial is not None:
                    pieces.append(pending_piece(text[partial:]))
                return pieces
            pieces.append(text_piece(text[pos:start]))
            body = start + len(MARKER)
            while body < len(text) and text[body] in " \t\r\n":
                body += 1
            if body < len(text) and text[body] == "[" and not text.startswith(CALL_ID, body):
                block, after = self._array_block(text, start, body, final)
            else:
                block, after = self._named_block(text, start, body, final)
            pieces.extend(block)
            if after is None:
                return pieces  # the block runs to the end of the text
            pos = after

    def _array_block(
        self, text: str, start: int, body: int, final: bool
    ) -> tuple[list[Piece], int | None]:
        """``[TOOL_CALLS][{...}, ...]``: every element must be a call, or all is content."""
        try:
            array, end = self._decoder.raw_decode(text, body)
        except (ValueError, RecursionError):
            return ([text_piece(text[start:])] if final else [pending_piece(text[start:])]), None
        calls = [call_from_json(item, ("arguments", "parameters")) for item in array]
        if not calls or any(call is None for call in calls):
            return [text_piece(text[start:end])], end
        # The first piece carries the block's raw text; the rest are zero-width.
        raws = [text[start:end]] + [""] * (len(calls) - 1)
        return [
            call_piece(raw, call) for raw, call in zip(raws, calls, strict=True) if call is not None
        ], end

    def _named_block(
        self, text: str, start: int, body: int, final: bool
    ) -> tuple[list[Piece], int | None]:
        """``[TOOL_CALLS]name[ARGS]{...}`` (with an optional ``[CALL_ID]id``)."""
        name_match = _NAME.match(text, body)
        pos = name_match.end() if name_match else body
        if text.startswith(CALL_ID, pos):
            id_match = _ID.match(text, pos + len(CALL_ID))
            pos = id_match.end() if id_match else pos + len(CALL_ID)
        header_ok = name_match is not None and text.startswith(ARGS, pos)
        if not header_ok:
            rest = text[pos:]
            if not final and (rest == "" or ARGS.startswith(rest) or CALL_ID.startswith(rest)):
                return [pending_piece(text[start:])], None
            # Not a call: the marker is plain text and scanning goes on after it.
            return [text_piece(MARKER)], start + len(MARKER)
        args_start = pos + len(ARGS)
        while args_start < len(text) and text[args_start] in " \t\r\n":
            args_start += 1
        try:
            arguments, end = self._decoder.raw_decode(text, args_start)
        except (ValueError, RecursionError):
            return ([text_piece(text[start:])] if final else [pending_piece(text[start:])]), None
        call = _named_call(name_match.group(0), arguments)  # type: ignore[union-attr]
        if call is None:
            return [text_piece(text[start:end])], end
        return [call_piece(text[start:end], call)], end


def _named_call(name: str, arguments: Any) -> ParsedCall | None:
    if not isinstance(arguments, dict):
        return None
    dumped = dump_arguments(arguments)
    return None if dumped is None else ParsedCall(name=name, arguments=dumped)
