"""The Responses API objects this server returns: the ``response`` object and its output
items (``reasoning``, ``message``, ``function_call``), as plain JSON-ready dicts.

One ``ResponseRecord`` per response: what was asked (echoed back as OpenAI does), its
status, output items and usage. The store keeps records; the streaming writer and the
non-streaming path both finish one with ``to_dict``.
"""

from __future__ import annotations

import time
import uuid
from dataclasses import dataclass, field
from typing import Any, Literal

from engine.entrypoints.openai.responses_protocol import ResponsesRequest

Status = Literal["in_progress", "completed", "incomplete", "cancelled", "failed"]


def new_item_id(prefix: str) -> str:
    return f"{prefix}_{uuid.uuid4().hex}"


def reasoning_item(item_id: str, text: str, status: str = "completed") -> dict[str, Any]:
    content = [{"type": "reasoning_text", "text": text}] if text or status != "in_progress" else []
    return {"id": item_id, "type": "reasoning", "summary": [], "content": content, "status": status}


def output_text_part(text: str) -> dict[str, Any]:
    return {"type": "output_text", "text": text, "annotations": [], "logprobs": []}


def message_item(item_id: str, text: str | None, status: str = "completed") -> dict[str, Any]:
    content = [] if text is None else [output_text_part(text)]
    return {
        "id": item_id,
        "type": "message",
        "role": "assistant",
        "status": status,
        "content": content,
    }


def function_call_item(
    item_id: str, call_id: str, name: str, arguments: str, status: str = "completed"
) -> dict[str, Any]:
    return {
        "id": item_id,
        "type": "function_call",
        "call_id": call_id,
        "name": name,
        "arguments": arguments,
        "status": status,
    }


@dataclass
class ResponseRecord:
    """One response: the request it answers, its state and, once done, its output."""

    id: str
    model: str
    request: ResponsesRequest
    # The chat messages that produced it (history + input, without instructions), so a
    # later ``previous_response_id`` continues the conversation.
    messages: list[dict[str, Any]]
    created_at: int = field(default_factory=lambda: int(time.time()))
    status: Status = "in_progress"
    output: list[dict[str, Any]] = field(default_factory=list)
    incomplete_reason: str | None = None
    error: dict[str, Any] | None = None
    num_input_tokens: int = 0
    num_output_tokens: int = 0
    num_reasoning_tokens: int = 0
    num_cached_tokens: int = 0
    engine_req_id: str | None = None  # set while the engine runs it (cancel aborts it)
    completed_at: int | None = None

    def finish(self, status: Status, incomplete_reason: str | None = None) -> None:
        self.status = status
        self.incomplete_reason = incomplete_reason
        self.engine_req_id = None
        if status == "completed":
            self.completed_at = int(time.time())

    def usage(self) -> dict[str, Any] | None:
        if self.status == "in_progress":
            return None
        return {
            "input_tokens": self.num_input_tokens,
            "input_tokens_details": {"cached_tokens": self.num_cached_tokens},
            "output_tokens": self.num_output_tokens,
            "output_tokens_details": {"reasoning_tokens": self.num_reasoning_tokens},
            "total_tokens": self.num_input_tokens + self.num_output_tokens,
        }

    def to_dict(self, output: list[dict[str, Any]] | None = None) -> dict[str, Any]:
        req = self.request
        text = req.text or {"format": {"type": "text"}}
        return {
            "id": self.id,
            "object": "response",
            "created_at": self.created_at,
            "completed_at": self.completed_at,
            "status": self.status,
            "error": self.error,
            "incomplete_details": (
                {"reason": self.incomplete_reason} if self.incomplete_reason else None
            ),
            "instructions": req.instructions,
            "max_output_tokens": req.max_output_tokens,
            "metadata": req.metadata or {},
            "model": self.model,
            "output": self.output if output is None else output,
            "parallel_tool_calls": req.parallel_tool_calls,
            "previous_response_id": req.previous_response_id,
            "reasoning": req.reasoning,
            "store": req.store,
            "temperature": req.temperature,
            "text": text,
            "tool_choice": req.tool_choice if req.tool_choice is not None else "auto",
            "tools": req.tools or [],
            "top_p": req.top_p,
            "truncation": req.truncation or "disabled",
            "usage": self.usage(),
            "user": req.user,
        }

    def conversation(self) -> list[dict[str, Any]]:
        """The chat messages after this response: its input, then its output as the
        assistant turn (calls as ``tool_calls``; reasoning is not carried over)."""
        content = "".join(
            part["text"]
            for item in self.output
            if item["type"] == "message"
            for part in item["content"]
        )
        calls = [
            {
                "id": item["call_id"],
                "type": "function",
                "function": {"name": item["name"], "arguments": item["arguments"]},
            }
            for item in self.output
            if item["type"] == "function_call"
        ]
        turn: dict[str, Any] = {"role": "assistant", "content": content}
        if calls:
            turn["tool_calls"] = calls
        return [*self.messages, turn]


def finish_status(finish_reason: str | None) -> tuple[Status, str | None]:
    """The response status of an engine finish reason (and the incomplete reason)."""
    if finish_reason == "length":
        return "incomplete", "max_output_tokens"
    if finish_reason == "abort":
        return "cancelled", None
    return "completed", None
