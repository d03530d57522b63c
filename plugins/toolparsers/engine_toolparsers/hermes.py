"""Hermes-style tool calls (Hermes 2/3, Qwen2.5, Qwen3): JSON inside ``<tool_call>`` tags.

    I'll look both up.
    <tool_call>
    {"name": "get_weather", "arguments": {"city": "Paris"}}
    </tool_call>
    <tool_call>
    {"name": "get_time", "arguments": {"tz": "CET"}}
    </tool_call>

A block whose JSON does not parse stays in the content as written. An unclosed block at the
end of the output is accepted if its JSON is complete, else it is content. The arguments
are the model's own text of the arguments object (so they stream as generated, see
``partial_call``); arguments given as a JSON string are decoded and re-encoded.
"""

from __future__ import annotations

import json
from typing import Any

from engine_sdk.interfaces.partial_json import scan_call

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

ARGUMENT_KEYS = ("arguments", "parameters")
START = "<tool_call>"
END = "</tool_call>"


class HermesToolParser(PieceToolParser):
    name = "hermes"
    streams_partial_calls = True

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

    def partial_call(self, pending: str) -> tuple[str, str] | None:
        if not pending.startswith(START):
            return None  # a partial start marker
        inner = pending[len(START) :]
        scanned = scan_call(inner, 0, ARGUMENT_KEYS)
        if not scanned.valid or scanned.name is None or not scanned.name.strip():
            return None
        if scanned.args_start is None or inner[scanned.args_start] != "{":
            return scanned.name.strip(), ""  # the arguments are sent once complete
        arguments = inner[scanned.args_start : scanned.args_end]
        return scanned.name.strip(), arguments.rstrip()


def _block(raw: str, inner: str) -> Piece:
    call = parse_hermes_json(inner)
    return text_piece(raw) if call is None else call_piece(raw, call)


def parse_hermes_json(inner: str) -> ParsedCall | None:
    try:
        obj = json.loads(inner)
    except (ValueError, RecursionError):
        return None
    call = call_from_json(obj, ARGUMENT_KEYS)
    if call is None:
        return None
    scanned = scan_call(inner, 0, ARGUMENT_KEYS)
    if scanned.args_start is None or scanned.args_end is None:
        return call
    raw = inner[scanned.args_start : scanned.args_end]
    # The model's own text when it is the object the call holds (an arguments key given
    # twice, or arguments as a JSON string, keep the re-encoded form).
    if raw.startswith("{") and json.loads(raw) == json.loads(call.arguments):
        return ParsedCall(call.name, raw)
    return call
