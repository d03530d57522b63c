"""Tool calls of a ``required`` or named ``tool_choice`` output (constrained JSON),
whole or streamed the OpenAI way: a call's id and name as soon as the name is complete,
then its arguments piece by piece as they are generated.

A named output is the function's arguments object itself. A ``required`` output is a JSON
array of ``{"name": ..., "parameters": {...}}`` elements, each read (finished or not)
by the SDK's ``scan_call``. The arguments sent (streamed or whole) are the model's own
text of the parameters value, so the streamed pieces always concatenate to the
non-streaming ``arguments``.
"""

from __future__ import annotations

import json

from engine_sdk.interfaces.messages import DeltaMessage, ToolCall, ToolCallDelta, make_tool_call_id
from engine_sdk.interfaces.partial_json import scan_call, skip_ws

from engine.entrypoints.openai.tool_choice import ToolPlan

_WHITESPACE = " \t\r\n"
_PARAMETERS = ("parameters",)


class ForcedToolCalls:
    """Tool calls of a ``required`` or named output; one per choice (keeps stream state)."""

    def __init__(self, plan: ToolPlan) -> None:
        assert plan.mode in ("required", "named")
        self.plan = plan
        self._ids: list[str] = []
        self._index = 0  # required: the element being streamed
        self._pos = 0  # required: where that element starts
        self._named = False  # the current call's id and name were sent
        self._num_sent = 0  # argument characters of the current call sent

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
        if not isinstance(items, list):
            return [], text or None
        calls = []
        pos = skip_ws(text, 0) + 1  # past "["
        for index in range(len(items)):
            element = scan_call(text, pos, _PARAMETERS)
            if element.name is None or element.end is None:
                return [], text or None
            if element.args_start is None or element.args_end is None:
                arguments = "{}"
            else:
                arguments = text[element.args_start : element.args_end]
            calls.append(ToolCall(element.name, arguments, id=self._id(index)))
            pos = skip_ws(text, element.end)
            pos += 1 if pos < len(text) and text[pos] == "," else 0
        return calls, None

    def stream(self, text: str, final: bool) -> DeltaMessage | None:
        """The tool-call deltas ``text`` (the whole output so far) adds."""
        if self.plan.mode == "named":
            body = text.strip()  # trailing whitespace waits for what follows it
            deltas = self._call_deltas(0, self.plan.name or "", body)
        else:
            deltas = self._stream_required(text)
        return DeltaMessage(tool_calls=deltas) if deltas else None

    def _id(self, index: int) -> str:
        while len(self._ids) <= index:
            self._ids.append(make_tool_call_id())
        return self._ids[index]

    def _call_deltas(self, index: int, name: str | None, arguments: str) -> list[ToolCallDelta]:
        """Id and name once the name is known, then the arguments not yet sent."""
        if name is None:
            return []
        delta = ToolCallDelta(index)
        if not self._named:
            delta.id, delta.name, delta.arguments = self._id(index), name, ""
            self._named = True
        if len(arguments) > self._num_sent:
            delta.arguments = (delta.arguments or "") + arguments[self._num_sent :]
            self._num_sent = len(arguments)
        return [] if delta.name is None and delta.arguments is None else [delta]

    def _stream_required(self, text: str) -> list[ToolCallDelta]:
        deltas: list[ToolCallDelta] = []
        while True:
            pos = skip_ws(text, self._pos)
            if pos < len(text) and text[pos] in "[,":
                self._pos = pos + 1
                continue
            element = scan_call(text, pos, _PARAMETERS)
            if not element.valid:
                return deltas
            arguments = ""
            if element.args_start is not None:
                end = element.args_end
                arguments = text[element.args_start : end] if end else text[element.args_start :]
                arguments = arguments.rstrip(_WHITESPACE)
            deltas += self._call_deltas(self._index, element.name, arguments)
            if element.end is None or element.name is None:
                return deltas
            if element.args_start is None and not self._num_sent:  # no parameters key
                deltas.append(ToolCallDelta(self._index, arguments="{}"))
            self._index += 1
            self._pos = element.end
            self._named = False
            self._num_sent = 0
