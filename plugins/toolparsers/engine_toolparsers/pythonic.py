"""Pythonic tool calls (Llama 3.2 / Llama 4 and others): a Python list of calls.

    [get_weather(city="Paris", days=3), get_time(tz='CET')]
    <|python_start|>[get_weather(city="Paris")]<|python_end|>

The list (optionally wrapped in ``<|python_start|>``/``<|python_end|>``) must open the
output; text after it is content. It is parsed with ``ast.parse`` and only the keyword
argument values are evaluated, with ``ast.literal_eval`` (JSON's ``true``/``false``/``null``
are read as Python's); nothing is ever executed. Anything else is content, unchanged.
"""

from __future__ import annotations

import ast
from typing import Any

from engine_toolparsers.arguments import dump_arguments
from engine_toolparsers.base import PieceToolParser
from engine_toolparsers.pieces import ParsedCall, Piece, call_piece, pending_piece, text_piece

START = "<|python_start|>"
END = "<|python_end|>"
_JSON_NAMES = {"true": True, "false": False, "null": None}


class PythonicToolParser(PieceToolParser):
    name = "pythonic"

    def split(self, text: str, final: bool, tools: list[dict[str, Any]] | None) -> list[Piece]:
        body = len(text) - len(text.lstrip())
        if text.startswith(START, body):
            body += len(START)
            body += len(text) - body - len(text[body:].lstrip())
        elif not final and body < len(text) and START.startswith(text[body:]):
            return [pending_piece(text)]
        if body == len(text) or text[body] != "[":
            if not final and body == len(text) and text.strip():
                return [pending_piece(text)]  # the start tag alone: the list may follow
            return [text_piece(text)]
        close = find_list_end(text, body)
        if close is None:
            return [text_piece(text) if final else pending_piece(text)]
        calls = parse_call_list(text[body : close + 1])
        if calls is None:
            return [text_piece(text)]
        end = close + 1
        rest = text[end:].lstrip()
        waiting_for_end_tag = False
        if rest.startswith(END):
            end = len(text) - len(rest) + len(END)
        elif not final and rest and END.startswith(rest):
            waiting_for_end_tag = True
        raws = [text[:end]] + [""] * (len(calls) - 1)
        pieces = [call_piece(raw, call) for raw, call in zip(raws, calls, strict=True)]
        tail = pending_piece(text[end:]) if waiting_for_end_tag else text_piece(text[end:])
        return pieces + [tail]


def find_list_end(text: str, start: int) -> int | None:
    """Index of the ``]`` closing the bracket at ``start``, skipping Python string literals."""
    depth = 0
    pos = start
    while pos < len(text):
        char = text[pos]
        if char in "'\"":
            after = _skip_string(text, pos)
            if after is None:
                return None
            pos = after
            continue
        if char in "([{":
            depth += 1
        elif char in ")]}":
            depth -= 1
            if depth == 0:
                return pos if char == "]" else None
        pos += 1
    return None


def _skip_string(text: str, pos: int) -> int | None:
    """Index just after the string literal opening at ``pos``; ``None`` if unterminated."""
    quote = text[pos] * 3 if text.startswith(text[pos] * 3, pos) else text[pos]
    pos += len(quote)
    while pos < len(text):
        if text[pos] == "\\":
            pos += 2
        elif text.startswith(quote, pos):
            return pos + len(quote)
        elif len(quote) == 1 and text[pos] == "\n":
            return None
        else:
            pos += 1
    return None


def parse_call_list(source: str) -> list[ParsedCall] | None:
    """The calls of ``[f(a=1), g()]``, or ``None`` unless it is exactly a list of calls."""
    try:
        tree = ast.parse(source, mode="eval")
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        return None
    if not isinstance(tree.body, ast.List) or not tree.body.elts:
        return None
    calls = []
    for node in tree.body.elts:
        call = _parse_call(node)
        if call is None:
            return None
        calls.append(call)
    return calls


def _parse_call(node: ast.expr) -> ParsedCall | None:
    if not isinstance(node, ast.Call) or node.args:
        return None
    name = _dotted_name(node.func)
    if name is None:
        return None
    arguments: dict[str, Any] = {}
    for keyword in node.keywords:
        if keyword.arg is None:  # **kwargs
            return None
        try:
            arguments[keyword.arg] = ast.literal_eval(_JsonNames().visit(keyword.value))
        except (ValueError, TypeError, SyntaxError, RecursionError, MemoryError):
            return None
    dumped = dump_arguments(arguments)
    return None if dumped is None else ParsedCall(name=name, arguments=dumped)


def _dotted_name(node: ast.expr) -> str | None:
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        parent = _dotted_name(node.value)
        return None if parent is None else f"{parent}.{node.attr}"
    return None


class _JsonNames(ast.NodeTransformer):
    """Reads the bare names ``true``/``false``/``null`` as constants."""

    def visit_Name(self, node: ast.Name) -> ast.expr:
        if node.id in _JSON_NAMES:
            return ast.copy_location(ast.Constant(_JSON_NAMES[node.id]), node)
        return node
