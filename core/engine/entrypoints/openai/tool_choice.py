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
always parse. ``ForcedToolCalls`` streams them the OpenAI way: a named call's arguments as
they are generated; a ``required`` array's calls one by one as each element completes.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from engine_sdk.interfaces.messages import DeltaMessage, ToolCall, ToolCallDelta

from engine.entrypoints.openai.chat_features import AUTO_TOOL_CHOICE_HINT, ChatFeatures
from engine.entrypoints.openai.errors import APIError
from engine.sampling_params import StructuredOutputsParams

_EMPTY_PARAMETERS: dict[str, Any] = {"type": "object", "properties": {}}


@dataclass
class ToolPlan:
    """``mode`` is none, auto, required or named (``name`` set)."""

    mode: str = "none"
    name: str | None = None
    tools: list[dict[str, Any]] = field(default_factory=list)
    constraint: StructuredOutputsParams | None = None


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


def required_schema(functions: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """A JSON array of at least one call to one of ``functions``."""
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
    return {"type": "array", "minItems": 1, "items": item}


def plan_tools(
    tools: list[dict[str, Any]] | None, tool_choice: Any, features: ChatFeatures
) -> ToolPlan:
    """The plan for a request's ``tools`` / ``tool_choice``; 400 for an invalid pair."""
    tools = list(tools or [])
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
        schema = required_schema(functions)
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


class ForcedToolCalls:
    """Tool calls of a ``required`` or named output (constrained JSON); one per choice."""

    def __init__(self, plan: ToolPlan) -> None:
        assert plan.mode in ("required", "named")
        self.plan = plan
        self._num_sent = 0  # calls (required) or argument characters (named) streamed
        self._ids: list[str] = []
        self._pos = 0  # required: where the next array element starts

    def parse(self, text: str) -> tuple[list[ToolCall], str | None]:
        """``(calls, content)``: output that is not valid JSON stays content."""
        if self.plan.mode == "named":
            arguments = text.strip()
            if not arguments:
                return [], None
            return [ToolCall(self.plan.name or "", arguments, id=self._id(0))], None
        try:
            items = json.loads(text)
        except json.JSONDecodeError:
            return [], text or None
        calls = []
        for i, item in enumerate(items if isinstance(items, list) else []):
            if not isinstance(item, dict) or not isinstance(item.get("name"), str):
                return [], text or None
            arguments = json.dumps(item.get("parameters", {}), ensure_ascii=False)
            calls.append(ToolCall(item["name"], arguments, id=self._id(i)))
        return calls, None

    def stream(self, text: str, final: bool) -> DeltaMessage | None:
        """The tool-call deltas ``text`` (the whole output so far) adds."""
        if self.plan.mode == "named":
            return self._stream_named(text, final)
        return self._stream_required(text)

    def _id(self, index: int) -> str:
        from engine_sdk.interfaces.messages import make_tool_call_id

        while len(self._ids) <= index:
            self._ids.append(make_tool_call_id())
        return self._ids[index]

    def _stream_named(self, text: str, final: bool) -> DeltaMessage | None:
        # Trailing whitespace waits for what follows it, so the streamed arguments are
        # always a prefix of (and finally equal to) parse()'s stripped text.
        body = text.strip()
        if len(body) <= self._num_sent:
            return None
        deltas = []
        if self._num_sent == 0:
            deltas.append(ToolCallDelta(0, id=self._id(0), name=self.plan.name, arguments=""))
        deltas.append(ToolCallDelta(0, arguments=body[self._num_sent :]))
        self._num_sent = len(body)
        return DeltaMessage(tool_calls=deltas)

    def _stream_required(self, text: str) -> DeltaMessage | None:
        decoder = json.JSONDecoder()
        deltas = []
        pos = self._pos
        while True:
            while pos < len(text) and text[pos] in " \t\r\n[,":
                pos += 1
            if pos >= len(text) or text[pos] == "]":
                break
            try:
                item, end = decoder.raw_decode(text, pos)
            except json.JSONDecodeError:
                break  # the element is still being generated
            if not isinstance(item, dict) or not isinstance(item.get("name"), str):
                break
            index = self._num_sent
            arguments = json.dumps(item.get("parameters", {}), ensure_ascii=False)
            deltas.append(ToolCallDelta(index, id=self._id(index), name=item["name"]))
            deltas.append(ToolCallDelta(index, arguments=arguments))
            self._num_sent += 1
            pos = end
        self._pos = pos
        return DeltaMessage(tool_calls=deltas) if deltas else None
