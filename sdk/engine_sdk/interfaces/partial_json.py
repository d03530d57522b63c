"""Reading a tool call out of unfinished JSON, for streaming its arguments as generated.

``scan_call`` reads one ``{"name": ..., "arguments": {...}}`` object (the arguments key is
the format's) from a text that may stop anywhere, and says where the arguments value
starts and, once generated, ends::

    {"name": "get_weather", "arguments": {"city": "Par      <- text so far
                                         ^ args_start     (args_end: None, not yet)

A parser that reports the model's own text of the arguments (``text[args_start:args_end]``)
as the final ``arguments`` can stream every prefix of it (less trailing whitespace, which
may be followed by more) and the pieces concatenate to exactly the final string.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

_WHITESPACE = " \t\r\n"
_SCALAR_CHARS = frozenset("-+.0123456789eEtruefalsn")


@dataclass
class ScannedCall:
    """One ``{"name": ..., <arguments key>: ...}`` object; ``None`` where not yet generated."""

    name: str | None = None
    args_start: int | None = None
    args_end: int | None = None
    end: int | None = None  # just past the closing brace
    valid: bool = True


def _string(raw: str) -> str | None:
    """The JSON string ``raw`` decoded; None if it is not one (a control character...)."""
    try:
        value = json.loads(raw)
    except ValueError:
        return None
    return value if isinstance(value, str) else None


def skip_ws(text: str, i: int) -> int:
    while i < len(text) and text[i] in _WHITESPACE:
        i += 1
    return i


def _string_end(text: str, i: int) -> int | None:
    """Just past the JSON string starting at ``text[i] == '"'``; None if unfinished."""
    i += 1
    while i < len(text):
        if text[i] == "\\":
            i += 2
            continue
        if text[i] == '"':
            return i + 1
        i += 1
    return None


def value_end(text: str, i: int) -> int | None:
    """Just past the JSON value starting at ``text[i]``; None if unfinished."""
    first = text[i]
    if first == '"':
        return _string_end(text, i)
    if first in "{[":
        depth = 0
        while i < len(text):
            c = text[i]
            if c == '"':
                end = _string_end(text, i)
                if end is None:
                    return None
                i = end
                continue
            if c in "{[":
                depth += 1
            elif c in "}]":
                depth -= 1
                if depth == 0:
                    return i + 1
            i += 1
        return None
    while i < len(text) and text[i] in _SCALAR_CHARS:
        i += 1
    return i if i < len(text) else None  # a number may still grow


def scan_call(text: str, pos: int, argument_keys: tuple[str, ...]) -> ScannedCall:
    """Read the call object starting at (or after whitespace from) ``pos``."""
    out = ScannedCall()
    i = skip_ws(text, pos)
    if i >= len(text):
        return out
    if text[i] != "{":
        out.valid = False
        return out
    i += 1
    while True:
        i = skip_ws(text, i)
        if i >= len(text):
            return out
        if text[i] == "}":
            out.end = i + 1
            return out
        if text[i] == ",":
            i += 1
            continue
        if text[i] != '"':
            out.valid = False
            return out
        key_end = _string_end(text, i)
        if key_end is None:
            return out
        key = _string(text[i:key_end])
        if key is None:
            out.valid = False
            return out
        i = skip_ws(text, key_end)
        if i >= len(text):
            return out
        if text[i] != ":":
            out.valid = False
            return out
        i = skip_ws(text, i + 1)
        if i >= len(text):
            return out
        end = value_end(text, i)
        if key in argument_keys:
            out.args_start, out.args_end = i, end
        if end is None:
            return out
        if key == "name":
            name = _string(text[i:end])
            if name is None:
                out.valid = False
                return out
            out.name = name
        i = end
