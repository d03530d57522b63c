"""Plain records parsers return: tool calls and streaming deltas (no torch)."""

from __future__ import annotations

import uuid
from dataclasses import dataclass, field


def make_tool_call_id() -> str:
    return f"call_{uuid.uuid4().hex[:24]}"


@dataclass
class ToolCall:
    """One complete function call: ``arguments`` is a JSON string, as in the OpenAI API."""

    name: str
    arguments: str
    id: str = field(default_factory=make_tool_call_id)


@dataclass
class ToolCallDelta:
    """A streamed piece of tool call ``index``: the first delta carries id and name."""

    index: int
    id: str | None = None
    name: str | None = None
    arguments: str | None = None


@dataclass
class DeltaMessage:
    """What one streaming step adds to the assistant message."""

    content: str | None = None
    reasoning_content: str | None = None
    tool_calls: list[ToolCallDelta] = field(default_factory=list)

    def is_empty(self) -> bool:
        return not self.content and not self.reasoning_content and not self.tool_calls


@dataclass
class ExtractedToolCalls:
    """Result of parsing a whole model output for tool calls."""

    tool_calls: list[ToolCall]
    content: str | None

    @property
    def tools_called(self) -> bool:
        return bool(self.tool_calls)
