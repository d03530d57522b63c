"""Hermes-style tool calls (Hermes 2/3, Qwen2.5, Qwen3): JSON inside ``<tool_call>`` tags.

    I'll look both up.
    <tool_call>
    {"name": "get_weather", "arguments": {"city": "Paris"}}
    </tool_call>
    <tool_call>
    {"name": "get_time", "arguments": {"tz": "CET"}}
    </tool_call>

A block whose JSON does not parse stays in the content as written. An unclosed block at the
end of the output is accepted if its JSON is complete, else it is content.
"""

from __future__ import annotations

import json
from typing import Any

from engine_toolparsers.arguments import call_from_json
from engine_toolparsers.base import PieceToolParser
from engine_toolparsers.pieces import (
    ParsedCall,
    Piece,
    call_piece,
    partial_marker_start,
    pending_piece,
    text_piece,
)

START = "<tool_call>"
END = "</tool_call>"


class HermesToolParser(PieceToolParser):
    name = "hermes"

    def split(self, text: str, final: bool, tools: list[dict[str, Any]] | None) -> list[Piece]:
        pieces: list[Piece] = []
        pos = 0
        while True:
            start = text.find(START, pos)
            if start < 0:
                partial = None if final else partial_marker_start(text, (START,), pos)
                end_of_text = len(text) if partial is None else partial
                pieces.append(text_piece(text[pos:end_of_text]))
                if partial is not None:
                    pieces.append(pending_piece(text[partial:]))
                return pieces
            pieces.append(text_piece(text[pos:start]))
            end = text.find(END, start + len(START))
            if end < 0:
                if not final:
                    pieces.append(pending_piece(text[start:]))
                    return pieces
                pieces.append(_block(text[start:], text[start + len(START) :]))
                return pieces
            pieces.append(_block(text[start : end + len(END)], text[start + len(START) : end]))
            pos = end + len(END)


def _block(raw: str, inner: str) -> Piece:
    call = parse_hermes_json(inner)
    return text_piece(raw) if call is None else call_piece(raw, call)


def parse_hermes_json(inner: str) -> ParsedCall | None:
    try:
        obj = json.loads(inner)
    except (ValueError, RecursionError):
        return None
    return call_from_json(obj, ("arguments", "parameters"))
