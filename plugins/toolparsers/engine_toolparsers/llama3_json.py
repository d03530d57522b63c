"""Llama 3.x JSON tool calls: the output is one or more JSON call objects.

    <|python_tag|>{"name": "get_weather", "parameters": {"city": "Paris"}}; {"name": ...}

The optional ``<|python_tag|>`` (kept only when special tokens are not skipped) and the
first object must open the output. Objects are separated by ``;`` and/or whitespace; the
first thing that is not a valid call object ends the calls and is content from there on.
An output whose first object is not a call is content, unchanged.
"""

from __future__ import annotations

import json
from typing import Any

from engine_toolparsers.arguments import call_from_json
from engine_toolparsers.base import PieceToolParser
from engine_toolparsers.pieces import Piece, call_piece, pending_piece, text_piece

PYTHON_TAG = "<|python_tag|>"
_SEPARATORS = " \t\r\n;"


class Llama3JsonToolParser(PieceToolParser):
    name = "llama3_json"

    def __init__(self, tokenizer: Any = None) -> None:
        super().__init__(tokenizer)
        self._decoder = json.JSONDecoder()

    def split(self, text: str, final: bool, tools: list[dict[str, Any]] | None) -> list[Piece]:
        body = len(text) - len(text.lstrip())
        if text.startswith(PYTHON_TAG, body):
            body += len(PYTHON_TAG)
        elif not final and body < len(text) and PYTHON_TAG.startswith(text[body:]):
            return [pending_piece(text)]
        pieces: list[Piece] = []
        pos = body
        while True:
            while pos < len(text) and text[pos] in _SEPARATORS:
                pos += 1
            if pos == len(text):
                if pieces:
                    return pieces  # trailing separators after the calls are dropped
                if final or not text.strip():
                    return [text_piece(text)]  # no call at all: the output is content
                return [pending_piece(text)]  # a tag or separators: a call may follow
            if text[pos] != "{":
                return self._rest_is_content(pieces, text, pos)
            try:
                obj, end = self._decoder.raw_decode(text, pos)
            except (ValueError, RecursionError):
                if final:
                    return self._rest_is_content(pieces, text, pos)
                raw_start = 0 if not pieces else pos
                return pieces + [pending_piece(text[raw_start:])]
            call = call_from_json(obj, ("parameters", "arguments"))
            if call is None:
                return self._rest_is_content(pieces, text, pos)
            pieces.append(call_piece(text[0 if not pieces else pos : end], call))
            pos = end

    @staticmethod
    def _rest_is_content(pieces: list[Piece], text: str, pos: int) -> list[Piece]:
        if not pieces:
            return [text_piece(text)]
        return pieces + [text_piece(text[pos:])]
