"""Qwen3-Coder XML tool calls: one ``<function=...>`` with ``<parameter=...>`` children.

    <tool_call>
    <function=get_weather>
    <parameter=city>
    Paris
    </parameter>
    <parameter=days>
    3
    </parameter>
    </function>
    </tool_call>

A bare ``<function=...>...</function>`` without the ``<tool_call>`` wrapper is accepted too.
Values are text; they are converted to the JSON type the request's tool schema gives the
parameter (integer, number, boolean, null, object/array via JSON), else kept as strings.
A missing ``</parameter>`` is tolerated; a missing ``</function>`` is not (content).
"""

from __future__ import annotations

import json
import re
from typing import Any

from engine_toolparsers.arguments import dump_arguments, tool_parameter_schemas
from engine_toolparsers.base import PieceToolParser
from engine_toolparsers.pieces import (
    ParsedCall,
    Piece,
    call_piece,
    find_first,
    partial_marker_start,
    pending_piece,
    text_piece,
)

TOOL_CALL_START = "<tool_call>"
TOOL_CALL_END = "</tool_call>"
FUNCTION_START = "<function="
FUNCTION_END = "</function>"
_FUNCTION = re.compile(r"<function=([^>\n]+)>(.*?)</function>", re.DOTALL)
_PARAMETER = re.compile(r"<parameter=([^>\n]+)>(.*?)(?:</parameter>|(?=<parameter=)|\Z)", re.DOTALL)


class Qwen3XmlToolParser(PieceToolParser):
    name = "qwen3_xml"

    def split(self, text: str, final: bool, tools: list[dict[str, Any]] | None) -> list[Piece]:
        schemas = tool_parameter_schemas(tools)
        pieces: list[Piece] = []
        pos = 0
        while True:
            found = find_first(text, (TOOL_CALL_START, FUNCTION_START), pos)
            if found is None:
                markers = (TOOL_CALL_START, FUNCTION_START)
                partial = None if final else partial_marker_start(text, markers, pos)
                pieces.append(text_piece(text[pos : len(text) if partial is None else partial]))
                if partial is not None:
                    pieces.append(pending_piece(text[partial:]))
                return pieces
            start, marker = found
            pieces.append(text_piece(text[pos:start]))
            end_marker = TOOL_CALL_END if marker == TOOL_CALL_START else FUNCTION_END
            end = text.find(end_marker, start + len(marker))
            if end < 0:
                if final:
                    pieces.extend(_block(text[start:], text[start:], marker, schemas))
                else:
                    pieces.append(pending_piece(text[start:]))
                return pieces
            end += len(end_marker)
            pieces.extend(_block(text[start:end], text[start:end], marker, schemas))
            pos = end


def _block(raw: str, block: str, marker: str, schemas: dict[str, dict[str, Any]]) -> list[Piece]:
    """The calls in one block, or the block as text if anything in it is malformed."""
    if marker == TOOL_CALL_START:
        inner = block[len(TOOL_CALL_START) :]
        if inner.endswith(TOOL_CALL_END):
            inner = inner[: -len(TOOL_CALL_END)]
    else:
        inner = block
    calls: list[ParsedCall] = []
    pos = 0
    for match in _FUNCTION.finditer(inner):
        if inner[pos : match.start()].strip():
            return [text_piece(raw)]
        call = _parse_function(match.group(1).strip(), match.group(2), schemas)
        if call is None:
            return [text_piece(raw)]
        calls.append(call)
        pos = match.end()
    if not calls or inner[pos:].strip():
        return [text_piece(raw)]
    raws = [raw] + [""] * (len(calls) - 1)
    return [call_piece(piece_raw, call) for piece_raw, call in zip(raws, calls, strict=True)]


def _parse_function(name: str, body: str, schemas: dict[str, dict[str, Any]]) -> ParsedCall | None:
    if not name:
        return None
    properties = schemas.get(name, {})
    arguments: dict[str, Any] = {}
    pos = 0
    for match in _PARAMETER.finditer(body):
        if body[pos : match.start()].strip():
            return None
        key = match.group(1).strip()
        arguments[key] = convert_value(_trim_newlines(match.group(2)), properties.get(key))
        pos = match.end()
    if body[pos:].strip():
        return None
    dumped = dump_arguments(arguments)
    return None if dumped is None else ParsedCall(name=name, arguments=dumped)


def _trim_newlines(value: str) -> str:
    """Drop the one newline after ``<parameter=..>`` and the one before ``</parameter>``."""
    if value.startswith("\n"):
        value = value[1:]
    if value.endswith("\n"):
        value = value[:-1]
    return value


def convert_value(value: str, schema: Any) -> Any:
    """``value`` as the JSON type ``schema`` declares; the string itself when it does not fit."""
    types = _schema_types(schema)
    if "null" in types and value.strip() == "null":
        return None
    for kind in types:
        if kind == "string":
            return value
        converted = _convert(value.strip(), kind)
        if converted is not _NO_MATCH:
            return converted
    return value


_NO_MATCH = object()


def _convert(value: str, kind: str) -> Any:
    if kind == "integer":
        try:
            return int(value)
        except ValueError:
            return _NO_MATCH
    if kind == "number":
        try:
            number = float(value)
        except ValueError:
            return _NO_MATCH
        if number != number or number in (float("inf"), float("-inf")):
            return _NO_MATCH
        return int(value) if re.fullmatch(r"[-+]?\d+", value) else number
    if kind == "boolean":
        lowered = value.lower()
        return {"true": True, "false": False}.get(lowered, _NO_MATCH)
    if kind in ("object", "array"):
        try:
            parsed = json.loads(value)
        except (ValueError, RecursionError):
            return _NO_MATCH
        expected = dict if kind == "object" else list
        return parsed if isinstance(parsed, expected) else _NO_MATCH
    return _NO_MATCH


def _schema_types(schema: Any) -> list[str]:
    """The declared JSON types of a property schema, in order (``type`` or ``anyOf``)."""
    if not isinstance(schema, dict):
        return []
    declared = schema.get("type")
    if isinstance(declared, str):
        return [declared]
    if isinstance(declared, list):
        return [kind for kind in declared if isinstance(kind, str)]
    types: list[str] = []
    for option in schema.get("anyOf", schema.get("oneOf", [])) or []:
        types.extend(_schema_types(option))
    return types
