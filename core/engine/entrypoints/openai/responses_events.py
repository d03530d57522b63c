"""Parser deltas -> Responses output items and their typed stream events, in order.

The output is a sequence of items, one open at a time; a delta of another kind closes the
open item and opens the next::

    reasoning_content ─> reasoning item   (reasoning_text.delta ...)
    content           ─> message item     (content_part.added, output_text.delta ...)
    tool call delta   ─> function_call    (function_call_arguments.delta ...)

Each item opens with ``response.output_item.added`` (and ``response.content_part.added``
for text) and closes with the matching ``*.done`` events and ``response.output_item.done``.
Whitespace-only content is held back until real content follows, so the blank lines
around tool calls do not become empty messages. Both the streaming and the non-streaming
paths run through here, so they produce the same items.
"""

from __future__ import annotations

from typing import Any

from engine_sdk.interfaces.messages import DeltaMessage, ToolCallDelta

from engine.entrypoints.openai.responses_output import (
    function_call_item,
    message_item,
    new_item_id,
    output_text_part,
    reasoning_item,
)

Event = dict[str, Any]


class _OpenItem:
    def __init__(self, kind: str, output_index: int, call_index: int | None = None) -> None:
        self.kind = kind
        self.output_index = output_index
        self.id = new_item_id({"reasoning": "rs", "message": "msg", "function_call": "fc"}[kind])
        self.text = ""  # reasoning or message text, or the call's arguments
        self.call_index = call_index
        self.call_id = ""
        self.name = ""


class ResponseEvents:
    """Builds the output items of one response; each ``add`` returns the events it causes."""

    def __init__(self) -> None:
        self.items: list[dict[str, Any]] = []  # finished items, in output order
        self._open: _OpenItem | None = None
        self._held_space = ""

    @property
    def reasoning_text(self) -> str:
        return "".join(
            part["text"] for item in self.items if item["type"] == "reasoning"
            for part in item["content"]
        )  # fmt: skip

    def add(self, delta: DeltaMessage) -> list[Event]:
        events: list[Event] = []
        if delta.reasoning_content:
            events += self._append("reasoning", delta.reasoning_content)
        if delta.content:
            events += self._content(delta.content)
        for call in delta.tool_calls:
            events += self._tool_call(call)
        return events

    def finish(self, status: str = "completed", had_tool_calls: bool = False) -> list[Event]:
        """Close the open item; held-back whitespace becomes a message only if nothing else
        was said (an all-whitespace answer is still an answer)."""
        events: list[Event] = []
        if self._held_space and not self.items and self._open is None and not had_tool_calls:
            events += self._append("message", self._held_space)
        self._held_space = ""
        events += self._close(status)
        return events

    # -- phases --------------------------------------------------------------------------------

    def _content(self, text: str) -> list[Event]:
        open_message = self._open is not None and self._open.kind == "message"
        if not open_message and not text.strip():
            self._held_space += text
            return []
        text, self._held_space = self._held_space + text, ""
        return self._append("message", text)

    def _append(self, kind: str, text: str) -> list[Event]:
        events: list[Event] = []
        if self._open is None or self._open.kind != kind:
            events += self._close()
            events += self._start(_OpenItem(kind, len(self.items)))
        item = self._open
        assert item is not None
        item.text += text
        event_type = (
            "response.reasoning_text.delta" if kind == "reasoning" else "response.output_text.delta"
        )
        event: Event = {
            "type": event_type,
            "item_id": item.id,
            "output_index": item.output_index,
            "content_index": 0,
            "delta": text,
        }
        if kind == "message":
            event["logprobs"] = []
        return [*events, event]

    def _tool_call(self, call: ToolCallDelta) -> list[Event]:
        events: list[Event] = []
        item = self._open
        if item is None or item.kind != "function_call" or item.call_index != call.index:
            self._held_space = ""
            events += self._close()
            item = _OpenItem("function_call", len(self.items), call.index)
            item.call_id = call.id or f"call_{item.id[3:27]}"
            item.name = call.name or ""
            events += self._start(item)
        elif call.name and not item.name:
            item.name = call.name
        if call.arguments:
            item.text += call.arguments
            events.append(
                {
                    "type": "response.function_call_arguments.delta",
                    "item_id": item.id,
                    "output_index": item.output_index,
                    "delta": call.arguments,
                }
            )
        return events

    def _start(self, item: _OpenItem) -> list[Event]:
        self._open = item
        added = {
            "type": "response.output_item.added",
            "output_index": item.output_index,
            "item": self._item(item, "in_progress"),
        }
        if item.kind == "function_call":
            return [added]
        part = (
            {"type": "reasoning_text", "text": ""}
            if item.kind == "reasoning"
            else output_text_part("")
        )
        return [added, {**self._where(item), "type": "response.content_part.added", "part": part}]

    def _close(self, status: str = "completed") -> list[Event]:
        item, self._open = self._open, None
        if item is None:
            return []
        events: list[Event] = []
        if item.kind == "function_call":
            events.append(
                {
                    "type": "response.function_call_arguments.done",
                    "item_id": item.id,
                    "output_index": item.output_index,
                    "arguments": item.text,
                }
            )
        else:
            where = self._where(item)
            if item.kind == "reasoning":
                part: dict[str, Any] = {"type": "reasoning_text", "text": item.text}
                events.append({**where, "type": "response.reasoning_text.done", "text": item.text})
            else:
                part = output_text_part(item.text)
                events.append(
                    {
                        **where,
                        "type": "response.output_text.done",
                        "text": item.text,
                        "logprobs": [],
                    }
                )
            events.append({**where, "type": "response.content_part.done", "part": part})
        done = self._item(item, "completed" if status == "completed" else "incomplete")
        self.items.append(done)
        events.append(
            {"type": "response.output_item.done", "output_index": item.output_index, "item": done}
        )
        return events

    @staticmethod
    def _where(item: _OpenItem) -> dict[str, Any]:
        return {"item_id": item.id, "output_index": item.output_index, "content_index": 0}

    @staticmethod
    def _item(item: _OpenItem, status: str) -> dict[str, Any]:
        done = status != "in_progress"
        if item.kind == "reasoning":
            return reasoning_item(item.id, item.text if done else "", status)
        if item.kind == "message":
            return message_item(item.id, item.text if done else None, status)
        arguments = item.text if done else ""
        return function_call_item(item.id, item.call_id, item.name, arguments, status)
