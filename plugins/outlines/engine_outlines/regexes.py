"""Every constraint as a regex, the one thing outlines-core compiles.

- ``json``: a JSON Schema, checked against its meta-schema (``jsonschema``), then turned
  into a regex by ``outlines_core.json_schema.build_regex_from_schema``. Whitespace between
  tokens is at most one space (outlines' default): a weak model cannot stall in an endless
  run of blanks. Recursive ``$ref`` schemas unroll to ``max_recursion_depth`` levels.
- ``choice``: an alternation of the choices, each escaped character by character.
- ``json_object``, and a schema that is just ``{"type": "object"}`` or
  ``{"type": "array"}``: values nest at most ``JSON_OBJECT_DEPTH`` levels of
  objects/arrays (a regular language cannot count brackets without a bound; at depth 2 an
  object's values may be objects or arrays of scalars).
- ``regex``: passed through (Rust ``regex`` syntax, always matched in full; no
  look-around, no back-references).
- ``grammar`` (EBNF/Lark): not regular in general; outlines-core has no CFG engine, so it
  is refused with a message naming what works.
"""

from __future__ import annotations

import json
import re
from typing import Any

JSON_OBJECT_DEPTH = 2
MAX_SCHEMA_RECURSION_DEPTH = 3

REGEX_HINT = (
    "; the regex uses Rust regex syntax and must match the whole output: look-around, "
    "back-references and anchors (^, $, \\b) are not supported"
)
GRAMMAR_UNSUPPORTED = (
    "grammar is not supported by this server's structured output backend (it compiles "
    "regular languages only); use json, regex or choice, or the operator can install a "
    "backend that handles context-free grammars"
)


def _schema_text(spec: Any) -> str:
    if isinstance(spec, str):
        try:
            schema = json.loads(spec)
        except json.JSONDecodeError as exc:
            raise ValueError(f"the JSON schema is not valid JSON: {exc}") from exc
    else:
        schema = spec
    if not isinstance(schema, dict | bool):
        raise ValueError(f"a JSON schema must be an object, got {type(schema).__name__}")
    _check_meta_schema(schema)
    return json.dumps(schema, sort_keys=True)


def _check_meta_schema(schema: dict[str, Any] | bool) -> None:
    from jsonschema import SchemaError, validators

    validator = validators.validator_for(schema)
    try:
        validator.check_schema(schema)
    except RecursionError:
        raise ValueError("the JSON schema nests too deeply; flatten it") from None
    except SchemaError as exc:
        where = "/".join(str(p) for p in exc.absolute_path) or "(root)"
        raise ValueError(f"invalid JSON schema at {where}: {exc.message}") from exc


_PRIMITIVE = {"type": ["string", "number", "boolean", "null"]}
_OBJECT_SHAPE_KEYS = ("properties", "additionalProperties", "patternProperties", "required")
_ARRAY_SHAPE_KEYS = ("items", "prefixItems", "contains")


def any_json_schema(depth: int) -> dict[str, Any]:
    """Any JSON value with objects/arrays nested at most ``depth`` levels."""
    if depth == 0:
        return dict(_PRIMITIVE)
    inner = any_json_schema(depth - 1)
    return {
        "anyOf": [
            dict(_PRIMITIVE),
            {"type": "object", "additionalProperties": inner},
            {"type": "array", "items": inner},
        ]
    }


def bound_free_form(schema: Any, depth: int = JSON_OBJECT_DEPTH) -> Any:
    """A top-level ``{"type": "object"}`` / ``{"type": "array"}`` without a shape, with its
    values bounded to ``depth`` levels of nesting (outlines' own free-form regex nests
    deeper and takes minutes to index over a large vocabulary)."""
    if not isinstance(schema, dict):
        return schema
    if schema.get("type") == "object" and not any(k in schema for k in _OBJECT_SHAPE_KEYS):
        return {**schema, "additionalProperties": any_json_schema(depth - 1)}
    if schema.get("type") == "array" and not any(k in schema for k in _ARRAY_SHAPE_KEYS):
        return {**schema, "items": any_json_schema(depth - 1)}
    return schema


def json_schema_regex(spec: Any) -> str:
    from outlines_core.json_schema import build_regex_from_schema

    text = _schema_text(spec)
    text = json.dumps(bound_free_form(json.loads(text)), sort_keys=True)
    try:
        return str(build_regex_from_schema(text, None, MAX_SCHEMA_RECURSION_DEPTH))
    except RecursionError:
        raise ValueError("the JSON schema nests too deeply; flatten it") from None
    except (ValueError, TypeError) as exc:
        raise ValueError(f"cannot compile the JSON schema: {one_line(exc)}") from exc


def escape_literal(text: str) -> str:
    """``text`` as a regex matching exactly it: ASCII punctuation and control characters as
    ``\\x{..}`` escapes (valid in Rust regex whatever the character), the rest literal."""
    out = []
    for ch in text:
        if ch.isascii() and not ch.isalnum():
            out.append(f"\\x{{{ord(ch):x}}}")
        else:
            out.append(ch)
    return "".join(out)


def choice_regex(spec: Any) -> str:
    if not isinstance(spec, list | tuple) or not spec:
        raise ValueError("choice must be a non-empty list of strings")
    bad = [c for c in spec if not isinstance(c, str)]
    if bad:
        raise ValueError(f"every choice must be a string, got {bad[0]!r}")
    return "(" + "|".join(escape_literal(c) for c in spec) + ")"


def one_line(error: object) -> str:
    """outlines-core's multi-line messages as one line (they end up in an HTTP 400)."""
    return " ".join(str(error).split())


def check_regex(pattern: Any) -> str:
    if not isinstance(pattern, str):
        raise ValueError(f"regex must be a string, got {type(pattern).__name__}")
    return pattern


def explain_regex_failure(pattern: str, error: str) -> str:
    """A message for a regex outlines-core rejected: its reason, Python's if it has one."""
    reason = f"cannot compile the regex: {error}"
    try:
        re.compile(pattern)
    except re.error as exc:
        reason += f" ({exc})"
    return reason + REGEX_HINT


def constraint_regex(kind: str, spec: Any) -> str:
    """The regex of one constraint; ``ValueError`` says what is wrong with ``spec``."""
    if kind == "json":
        return json_schema_regex(spec)
    if kind == "regex":
        return check_regex(spec)
    if kind == "choice":
        return choice_regex(spec)
    if kind == "json_object":
        return json_schema_regex({"type": "object"})
    if kind == "grammar":
        raise ValueError(GRAMMAR_UNSUPPORTED)
    raise ValueError(
        f"unknown structured output kind {kind!r}; use json, regex, choice or json_object"
    )
