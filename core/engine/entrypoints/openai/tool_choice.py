"""``tools`` and ``tool_choice`` of a chat request: what to parse and what to enforce.

- ``none``: the tools still reach the chat template, the output is plain content.
- ``auto`` (the default when tools are sent and the server has a tool parser): the
  ``--tool-call-parser`` finds calls in the output. Explicit ``auto`` on a server without
  ``--enable-auto-tool-choice --tool-call-parser`` is a 400.
- ``required``: the output is constrained (structured outputs) to a JSON array of
  ``{"name": <one of the tools>, "parameters": <that tool's schema>}``, at least one.
- a named function ``{"type": "function", "function": {"name": F}}``: the output is
  constrained to F's parameters schema, and is F's arguments.

For the two forced modes the calls are read from the constrained JSON, so their arguments
always parse (``forced_tool_calls.py`` reads and streams them).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from engine.entrypoints.openai.chat_features import AUTO_TOOL_CHOICE_HINT, ChatFeatures
from engine.entrypoints.openai.errors import APIError
from engine.sampling_params import StructuredOutputsParams

_EMPTY_PARAMETERS: dict[str, Any] = {"type": "object", "properties": {}}


@dataclass
class ToolPlan:
    """``mode`` is none, auto, required or named (``name`` set); ``parallel`` False
    (``parallel_tool_calls: false``) allows at most one call."""

    mode: str = "none"
    name: str | None = None
    tools: list[dict[str, Any]] = field(default_factory=list)
    constraint: StructuredOutputsParams | None = None
    parallel: bool = True


def _functions(tools: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """Tool name -> its parameters schema; 400 naming the malformed tool."""
    out: dict[str, dict[str, Any]] = {}
    for i, tool in enumerate(tools):
        fn = tool.get("function") if isinstance(tool, dict) else None
        if tool.get("type", "function") != "function" or not isinstance(fn, dict):
            raise APIError(
                f'tools[{i}] must be {{"type": "function", "function": {{"name": ..., '
                '"parameters": {...}}}}',
                400,
                f"tools[{i}]",
            )
        name = fn.get("name")
        if not isinstance(name, str) or not name:
            raise APIError(f"tools[{i}].function.name must be a non-empty string", 400, "tools")
        parameters = fn.get("parameters")
        if parameters is None:
            parameters = _EMPTY_PARAMETERS
        if not isinstance(parameters, dict):
            raise APIError(
                f"tools[{i}].function.parameters must be a JSON Schema object",
                400,
                f"tools[{i}].function.parameters",
            )
        out[name] = parameters
    return out


def required_schema(functions: dict[str, dict[str, Any]], parallel: bool = True) -> dict[str, Any]:
    """A JSON array of at least one call to one of ``functions`` (exactly one when not
    ``parallel``)."""
    calls = [
        {
            "type": "object",
            "properties": {"name": {"type": "string", "enum": [name]}, "parameters": params},
            "required": ["name", "parameters"],
            "additionalProperties": False,
        }
        for name, params in functions.items()
    ]
    item = calls[0] if len(calls) == 1 else {"anyOf": calls}
    schema: dict[str, Any] = {"type": "array", "minItems": 1, "items": item}
    if not parallel:
        schema["maxItems"] = 1
    return schema


def plan_tools(
    tools: list[dict[str, Any]] | None,
    tool_choice: Any,
    features: ChatFeatures,
    parallel_tool_calls: bool | None = None,
) -> ToolPlan:
    """The plan for a request's ``tools`` / ``tool_choice``; 400 for an invalid pair."""
    plan = _plan_tools(list(tools or []), tool_choice, features, parallel_tool_calls is not False)
    plan.parallel = parallel_tool_calls is not False
    return plan


def _plan_tools(
    tools: list[dict[str, Any]], tool_choice: Any, features: ChatFeatures, parallel: bool
) -> ToolPlan:
    functions = _functions(tools)
    if tool_choice is None:
        mode = "auto" if tools and features.auto_tool_choice else "none"
        return ToolPlan(mode, tools=tools)
    if tool_choice == "none":
        return ToolPlan("none", tools=tools)
    if tool_choice == "auto":
        if not features.auto_tool_choice:
            raise APIError(AUTO_TOOL_CHOICE_HINT, 400, "tool_choice")
        return ToolPlan("auto", tools=tools)
    if not tools:
        raise APIError("tool_choice needs tools: send the functions in tools", 400, "tool_choice")
    if tool_choice == "required":
        schema = required_schema(functions, parallel)
        return ToolPlan("required", tools=tools, constraint=StructuredOutputsParams(json=schema))
    if isinstance(tool_choice, dict):
        fn = tool_choice.get("function")
        name = fn.get("name") if isinstance(fn, dict) else None
        if tool_choice.get("type") != "function" or not isinstance(name, str):
            raise APIError(
                'tool_choice must be "none", "auto", "required" or {"type": "function", '
                '"function": {"name": ...}}',
                400,
                "tool_choice",
            )
        if name not in functions:
            raise APIError(
                f"tool_choice names function {name!r}, which is not in tools "
                f"({', '.join(functions)})",
                400,
                "tool_choice",
            )
        constraint = StructuredOutputsParams(json=functions[name])
        return ToolPlan("named", name=name, tools=tools, constraint=constraint)
    raise APIError(
        f'tool_choice {tool_choice!r} is not supported; use "none", "auto", "required" or a '
        "named function",
        400,
        "tool_choice",
    )
