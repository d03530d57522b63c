"""Turning parsed call data into the OpenAI form: a name and a JSON-object argument string."""

from __future__ import annotations

import json
from typing import Any

from engine_toolparsers.pieces import ParsedCall


def dump_arguments(arguments: dict[str, Any]) -> str | None:
    """The arguments as the JSON string clients receive, or ``None`` if not JSON-encodable."""
    try:
        return json.dumps(arguments, ensure_ascii=False, allow_nan=False)
    except (TypeError, ValueError, RecursionError):
        return None


def call_from_json(obj: Any, argument_keys: tuple[str, ...]) -> ParsedCall | None:
    """A call from ``{"name": ..., <argument key>: {...}}``, or ``None`` if it is not one.

    The arguments may be missing (no arguments), an object, or a string holding a JSON
    object (some models double-encode them).
    """
    if not isinstance(obj, dict):
        return None
    name = obj.get("name")
    if not isinstance(name, str) or not name.strip():
        return None
    arguments: Any = {}
    for key in argument_keys:
        if key in obj:
            arguments = obj[key]
            break
    if isinstance(arguments, str):
        try:
            arguments = json.loads(arguments) if arguments.strip() else {}
        except ValueError:
            return None
    if arguments is None:
        arguments = {}
    if not isinstance(arguments, dict):
        return None
    dumped = dump_arguments(arguments)
    if dumped is None:
        return None
    return ParsedCall(name=name.strip(), arguments=dumped)


def tool_parameter_schemas(tools: list[dict[str, Any]] | None) -> dict[str, dict[str, Any]]:
    """Map tool name -> its JSON-schema ``properties`` from an OpenAI ``tools`` list."""
    schemas: dict[str, dict[str, Any]] = {}
    for tool in tools or ():
        if not isinstance(tool, dict):
            continue
        function = tool.get("function", tool)
        if not isinstance(function, dict) or not isinstance(function.get("name"), str):
            continue
        parameters = function.get("parameters")
        properties = parameters.get("properties") if isinstance(parameters, dict) else None
        schemas[function["name"]] = properties if isinstance(properties, dict) else {}
    return schemas
