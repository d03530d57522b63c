"""Structured outputs from an HTTP request: the ``structured_outputs`` field, OpenAI's
``response_format``, the removed ``guided_*`` fields, and compiling before queueing.

- ``structured_outputs``: exactly one of ``json`` (a JSON Schema), ``regex``, ``choice``
  (list of strings) or ``grammar`` (refused by backends that cannot compile grammars).
- ``response_format``: ``{"type": "json_schema", "json_schema": {"name", "schema",
  "strict"}}``, ``{"type": "json_object"}`` or ``{"type": "text"}`` (no constraint).
- ``guided_json`` & co. were removed: a 400 says what replaced each.

The engine's front end (``EngineClient.prepare``) runs the cheap checks (size, bounds) so a
malformed or hostile constraint is a 400 before anything is queued; the engine compiles
it (once, in a killable worker process with a deadline and a memory cap) before queueing
the request, and the runner later finds the grammar in the cache.
"""

from __future__ import annotations

from typing import Any

from engine.entrypoints.openai.errors import APIError
from engine.entrypoints.openai.protocol import SamplingFields
from engine.sampling_params import StructuredOutputsParams

_KINDS = ("json", "regex", "choice", "grammar")
_REPLACEMENTS = {
    "guided_json": 'structured_outputs: {"json": ...} or response_format',
    "guided_regex": 'structured_outputs: {"regex": ...}',
    "guided_choice": 'structured_outputs: {"choice": [...]}',
    "guided_grammar": 'structured_outputs: {"grammar": ...}',
    "guided_decoding_backend": "the server flag --structured-outputs-config.backend",
    "guided_whitespace_pattern": "nothing (the backend fixes the JSON whitespace)",
}


def check_removed_fields(body: SamplingFields) -> None:
    """400 for a removed ``guided_*`` field, naming what replaced it."""
    extra = body.model_extra or {}
    for name, replacement in _REPLACEMENTS.items():
        if name in extra and extra[name] is not None:
            raise APIError(f"{name} was removed; use {replacement}", 400, name)


def _from_structured_outputs(value: dict[str, Any]) -> StructuredOutputsParams:
    unknown = sorted(k for k in value if k not in (*_KINDS, "json_object"))
    if unknown:
        raise APIError(
            f"structured_outputs: unknown key(s) {', '.join(unknown)}; use exactly one of "
            f"{', '.join(_KINDS)}",
            400,
            "structured_outputs",
        )
    chosen = [k for k in (*_KINDS, "json_object") if value.get(k) not in (None, False)]
    if len(chosen) != 1:
        raise APIError(
            f"structured_outputs needs exactly one of {', '.join(_KINDS)}; got "
            f"{', '.join(chosen) or 'none'}",
            400,
            "structured_outputs",
        )
    kind = chosen[0]
    spec = value[kind]
    if kind == "choice" and not (
        isinstance(spec, list) and spec and all(isinstance(c, str) for c in spec)
    ):
        raise APIError(
            "structured_outputs.choice must be a non-empty list of strings",
            400,
            "structured_outputs.choice",
        )
    if kind in ("regex", "grammar") and not isinstance(spec, str):
        raise APIError(
            f"structured_outputs.{kind} must be a string", 400, f"structured_outputs.{kind}"
        )
    if kind == "json" and not isinstance(spec, dict | str | bool):
        raise APIError(
            "structured_outputs.json must be a JSON Schema (an object or its JSON text)",
            400,
            "structured_outputs.json",
        )
    if kind == "json_object":
        return StructuredOutputsParams(json_object=True)
    return StructuredOutputsParams(**{kind: spec})


def _from_response_format(value: dict[str, Any]) -> StructuredOutputsParams | None:
    kind = value.get("type")
    if kind in (None, "text"):
        return None
    if kind == "json_object":
        return StructuredOutputsParams(json_object=True)
    if kind == "json_schema":
        spec = value.get("json_schema")
        schema = spec.get("schema") if isinstance(spec, dict) else None
        if not isinstance(schema, dict):
            raise APIError(
                'response_format json_schema needs {"json_schema": {"name": ..., "schema": '
                "{...}}} with the schema as an object",
                400,
                "response_format.json_schema.schema",
            )
        return StructuredOutputsParams(json=schema)
    raise APIError(
        f"response_format.type {kind!r} is not supported; use text, json_object or json_schema",
        400,
        "response_format.type",
    )


def structured_outputs_from_request(req: SamplingFields) -> StructuredOutputsParams | None:
    """The request's constraint (``structured_outputs`` or ``response_format``), or None."""
    check_removed_fields(req)
    from_field = from_format = None
    if req.structured_outputs is not None:
        from_field = _from_structured_outputs(req.structured_outputs)
    if req.response_format is not None:
        from_format = _from_response_format(req.response_format)
    if from_field is not None and from_format is not None:
        raise APIError(
            "send either structured_outputs or response_format, not both",
            400,
            "response_format",
        )
    return from_field or from_format
