"""A tool parser for outputs that are only JSON: one call object or a list of them.

``{"name": "f", "arguments": {...}}`` or ``[{...}, {...}]`` becomes tool calls; anything
else (including malformed JSON) is returned as plain content, never raised. While
streaming, an output that starts like JSON is held back until generation ends, because
only the complete text tells whether it is a call.
"""

from __future__ import annotations

import json
from typing import Any

from engine_sdk.interfaces.messages import (
    DeltaMessage,
    ExtractedToolCalls,
    ToolCall,
    ToolCallDelta,
)
from engine_sdk.interfaces.tool_parser import ToolParser


def _parse_calls(text: str) -> list[ToolCall] | None:
    try:
        data = json.loads(text)
    except ValueError:
        return None
    items = data if isinstance(data, list) else [data]
    calls = []
    for item in items:
        if not isinstance(item, dict) or not isinstance(item.get("name"), str):
            return None
        arguments = item.get("arguments", {})
        if not isinstance(arguments, dict):
            return None
        calls.append(ToolCall(name=item["name"], arguments=json.dumps(arguments)))
    return calls or None


class JsonToolParser(ToolParser):
    """The whole output is a JSON call (or list of calls), or it is plain content."""

    name = "myplugin_json"

    def extract_tool_calls(
        self, model_output: str, tools: list[dict[str, Any]] | None = None
    ) -> ExtractedToolCalls:
        calls = _parse_calls(model_output.strip())
        if calls is None:
            return ExtractedToolCalls(tool_calls=[], content=model_output)
        return ExtractedToolCalls(tool_calls=calls, content=None)

    def extract_tool_calls_streaming(
        self,
        previous_text: str,
        current_text: str,
        delta_text: str,
        tools: list[dict[str, Any]] | None = None,
    ) -> DeltaMessage | None:
        if self._may_be_json(current_text):
            return None  # hold back: finish_streaming decides
        # Plain content: send everything not sent yet (a held-back whitespace prefix too).
        sent = "" if self._may_be_json(previous_text) else previous_text
        new = current_text[len(sent) :]
        return DeltaMessage(content=new) if new else None

    def finish_streaming(self, current_text: str) -> DeltaMessage | None:
        if not self._may_be_json(current_text):
            return None
        result = self.extract_tool_calls(current_text)
        if not result.tools_called:
            return DeltaMessage(content=current_text) if current_text else None
        deltas = [
            ToolCallDelta(index=i, id=call.id, name=call.name, arguments=call.arguments)
            for i, call in enumerate(result.tool_calls)
        ]
        return DeltaMessage(tool_calls=deltas)

    @staticmethod
    def _may_be_json(text: str) -> bool:
        stripped = text.lstrip()
        return stripped == "" or stripped[0] in "{["
