"""Bounds a constraint must meet before any backend builds it.

A grammar's automaton grows with its counted repetitions: ``a{1000}{1000}`` is a million
states, a schema's ``maxItems: 1000000`` or ``minLength: 100000`` the same in disguise,
and building it takes minutes and gigabytes. These checks run on the spec text in
microseconds, before the compile:

- ``max_repeat``: the largest count a regex repetition (``{m}``, ``{m,n}``, ``{m,}``) or a
  schema's length keyword (``minLength``, ``maxLength``, ``minItems``, ``maxItems``,
  ``minProperties``, ``maxProperties``) may ask for, multiplied along nesting: ``(a{10}){10}``
  counts 100, and a string of ``maxLength`` 100 inside an array of ``maxItems`` 10 counts
  1000. Regexes inside a schema (``pattern``) count too.
- ``max_schema_depth``: how deeply a JSON schema's objects and arrays may nest (a deeper
  one would exhaust the recursion of the schema tools).

Both are ``--structured-outputs-config`` settings. A bound does not catch every costly
grammar (``.*a.{14}`` has small counts and an exponential automaton); the compile
deadline stays the backstop for those.
"""

from __future__ import annotations

import json
from typing import Any

from engine.errors import RequestValidationError

_LENGTH_KEYWORDS = (
    "minLength", "maxLength", "minItems", "maxItems", "minProperties", "maxProperties",
)  # fmt: skip
_BRACED_ESCAPES = frozenset("xpPu")


def _too_large(kind: str, what: str, count: int, limit: int) -> RequestValidationError:
    return RequestValidationError(
        f"structured_outputs.{kind}: {what} asks for {count} repetitions, over the limit of "
        f"{limit} (counts multiply when nested); use smaller counts, or the operator can "
        "raise --structured-outputs-config.max-repeat"
    )


def _read_count(pattern: str, start: int) -> tuple[int, int] | None:
    """``{m}``, ``{m,}`` or ``{m,n}`` at ``start``: (largest count, index after ``}``)."""
    end = pattern.find("}", start)
    if end < 0:
        return None
    body = pattern[start + 1 : end]
    low, comma, high = body.partition(",")
    low, high = low.strip(), high.strip()
    if not (low.isdigit() or (comma and high.isdigit())) or (high and not high.isdigit()):
        return None
    count = int(high) if high else int(low)  # {m,} counts m: the rest is a plain star
    return count, end + 1


def _skip_class(pattern: str, i: int) -> int:
    """Index after the character class opening at ``i`` (nested classes, escapes)."""
    depth = 0
    n = len(pattern)
    while i < n:
        ch = pattern[i]
        if ch == "\\":
            i += 2
            continue
        if ch == "[":
            depth += 1
        elif ch == "]" and depth and i > 0:
            depth -= 1
            if depth == 0:
                return i + 1
        i += 1
    return n


def regex_repeat_count(pattern: str) -> int:
    """The largest product of nested counted repetitions in ``pattern`` (1 if none)."""
    # One frame per open group: the largest product inside it so far.
    frames: list[int] = [1]
    last = 1  # product of the atom just read (what a following quantifier multiplies)
    i, n = 0, len(pattern)
    while i < n:
        ch = pattern[i]
        if ch == "\\":
            if i + 2 < n and pattern[i + 1] in _BRACED_ESCAPES and pattern[i + 2] == "{":
                close = pattern.find("}", i)
                i = n if close < 0 else close + 1
            else:
                i += 2
            last = 1
        elif ch == "[":
            i = _skip_class(pattern, i)
            last = 1
        elif ch == "(":
            frames.append(1)
            i += 1
            last = 1
        elif ch == ")":
            last = frames.pop() if len(frames) > 1 else 1
            i += 1
        elif ch == "{" and (count := _read_count(pattern, i)) is not None:
            last *= max(count[0], 1)
            i = count[1]
        else:
            last = 1
            i += 1
        frames[-1] = max(frames[-1], last)
    return max(frames)


def check_regex(kind: str, pattern: str, max_repeat: int) -> None:
    count = regex_repeat_count(pattern)
    if count > max_repeat:
        raise _too_large(kind, "the regex", count, max_repeat)


def check_schema(schema: Any, max_repeat: int, max_depth: int) -> None:
    """Depth of nesting and the product of length keywords along each path; iterative,
    so a schema nested thousands of levels deep costs no recursion."""
    stack: list[tuple[Any, int, int, str]] = [(schema, 0, 1, "")]
    while stack:
        node, depth, factor, path = stack.pop()
        if depth > max_depth:
            raise RequestValidationError(
                f"structured_outputs.json: the schema nests more than {max_depth} levels of "
                f"objects and arrays (at ...{path[-80:]}); flatten it, or the operator "
                "can raise --structured-outputs-config.max-schema-depth"
            )
        if isinstance(node, dict):
            own = factor
            for keyword in _LENGTH_KEYWORDS:
                value = node.get(keyword)
                if isinstance(value, int | float) and not isinstance(value, bool):
                    count = max(int(min(value, 1 << 62)), 1) * factor
                    if count > max_repeat:
                        raise _too_large("json", f"{path or '(root)'}/{keyword}", count, max_repeat)
                    own = max(own, count)
            pattern = node.get("pattern")
            if isinstance(pattern, str) and regex_repeat_count(pattern) * own > max_repeat:
                count = regex_repeat_count(pattern) * own
                raise _too_large("json", f"{path or '(root)'}/pattern", count, max_repeat)
            for key, value in node.items():
                if isinstance(value, dict | list):
                    stack.append((value, depth + 1, own, f"{path}/{key}"))
        elif isinstance(node, list):
            for i, value in enumerate(node):
                if isinstance(value, dict | list):
                    stack.append((value, depth + 1, factor, f"{path}/{i}"))


def check_bounds(kind: str, canonical: str, max_repeat: int, max_depth: int) -> None:
    """``RequestValidationError`` when the constraint exceeds a bound (see the module)."""
    if kind == "regex":
        check_regex(kind, canonical, max_repeat)
    elif kind == "json":
        check_schema(json.loads(canonical), max_repeat, max_depth)
