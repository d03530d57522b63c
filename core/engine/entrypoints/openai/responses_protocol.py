"""``POST /v1/responses`` request body and its translation to a chat request.

The Responses API runs on the chat path: ``instructions`` become a system message, the
``input`` items (and a stored ``previous_response_id`` conversation) become chat messages,
function ``tools`` / ``tool_choice`` / ``text.format`` become their chat counterparts, so
the chat template, tool parsers, reasoning parser and structured-output backend apply
unchanged. Only what the engine can honour is accepted; the rest is a 400 naming the field.
"""

from __future__ import annotations

from typing import Any

from pydantic import Field

from engine.entrypoints.openai.errors import APIError
from engine.entrypoints.openai.protocol import ChatCompletionRequest, ChatMessage, OpenAIBase

# Engine sampling fields a Responses request may carry (``extra_body``), passed to chat as is.
_PASSTHROUGH = (
    "top_k", "min_p", "repetition_penalty", "seed", "stop", "presence_penalty",
    "frequency_penalty", "min_tokens", "ignore_eos", "stop_token_ids", "skip_special_tokens",
    "include_stop_str_in_output", "chat_template_kwargs",
)  # fmt: skip


class ResponsesRequest(OpenAIBase):
    model: str | None = None
    input: str | list[dict[str, Any]] = Field(default="")
    instructions: str | None = None
    max_output_tokens: int | None = Field(default=None, ge=1)
    temperature: float | None = None
    top_p: float | None = None
    tools: list[dict[str, Any]] | None = None
    tool_choice: str | dict[str, Any] | None = None
    parallel_tool_calls: bool = True
    text: dict[str, Any] | None = None
    reasoning: dict[str, Any] | None = None
    stream: bool = False
    store: bool = True
    background: bool = False
    previous_response_id: str | None = None
    metadata: dict[str, str] | None = None
    user: str | None = None
    truncation: str | None = None
    # engine fields (extra_body)
    top_k: int | None = None
    min_p: float | None = None
    repetition_penalty: float | None = None
    seed: int | None = None
    stop: str | list[str] | None = None
    presence_penalty: float | None = None
    frequency_penalty: float | None = None
    min_tokens: int = 0
    ignore_eos: bool = False
    stop_token_ids: list[int] | None = None
    skip_special_tokens: bool = True
    include_stop_str_in_output: bool = False
    chat_template_kwargs: dict[str, Any] | None = None
    cache_salt: str | None = None
    priority: int = 0


def check_supported(req: ResponsesRequest) -> None:
    """400 for what this server does not do, before any work."""
    if req.background:
        raise APIError(
            "background: true is not supported by this server; send the request without it "
            "(use stream: true to see output as it is generated).",
            400,
            "background",
        )
    if req.truncation not in (None, "disabled"):
        raise APIError(
            f"truncation {req.truncation!r} is not supported; send 'disabled' or leave it out "
            "(a too long input is a 400 naming the context length).",
            400,
            "truncation",
        )
    if isinstance(req.input, str) and not req.input and req.previous_response_id is None:
        raise APIError("input is required: send a string or a list of input items.", 400, "input")


def chat_tools(tools: list[dict[str, Any]] | None) -> list[dict[str, Any]] | None:
    """Responses function tools (flat) -> chat tools (nested under ``function``)."""
    if tools is None:
        return None
    out = []
    for i, tool in enumerate(tools):
        if tool.get("type") != "function" or not isinstance(tool.get("name"), str):
            raise APIError(
                f"tools[{i}]: only function tools ({{'type': 'function', 'name': ...}}) are "
                f"supported by this server (got type {tool.get('type')!r}).",
                400,
                f"tools[{i}]",
            )
        function = {"name": tool["name"], "parameters": tool.get("parameters") or {}}
        if tool.get("description"):
            function["description"] = tool["description"]
        out.append({"type": "function", "function": function})
    return out


def chat_tool_choice(choice: str | dict[str, Any] | None) -> str | dict[str, Any] | None:
    """``{"type": "function", "name": F}`` -> the chat form; strings pass through."""
    if choice is None or isinstance(choice, str):
        return choice
    if choice.get("type") == "function" and isinstance(choice.get("name"), str):
        return {"type": "function", "function": {"name": choice["name"]}}
    raise APIError(
        "tool_choice must be 'none', 'auto', 'required' or {'type': 'function', 'name': NAME}",
        400,
        "tool_choice",
    )


def chat_response_format(text: dict[str, Any] | None) -> dict[str, Any] | None:
    """``text.format`` -> the chat ``response_format`` (json_schema, json_object, text)."""
    fmt = (text or {}).get("format")
    if fmt is None:
        return None
    if not isinstance(fmt, dict):
        raise APIError("text.format must be an object with a type", 400, "text.format")
    kind = fmt.get("type")
    if kind == "json_schema":
        if not isinstance(fmt.get("schema"), dict):
            raise APIError(
                'text.format json_schema needs {"type": "json_schema", "name": ..., '
                '"schema": {...}} with the schema as an object',
                400,
                "text.format.schema",
            )
        spec = {"name": fmt.get("name") or "output", "schema": fmt["schema"]}
        return {"type": "json_schema", "json_schema": spec}
    if kind in ("json_object", "text"):
        return {"type": kind}
    raise APIError(
        f"text.format.type {kind!r} is not supported; use text, json_object or json_schema",
        400,
        "text.format.type",
    )


def input_messages(items: str | list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The ``input`` as chat messages (dicts): messages, function calls and their outputs.

    Consecutive ``function_call`` items become one assistant message with several tool
    calls; ``reasoning`` items are dropped (the chat templates do not take them back).
    """
    if isinstance(items, str):
        return [{"role": "user", "content": items}] if items else []
    messages: list[dict[str, Any]] = []
    for i, item in enumerate(items):
        kind = item.get("type", "message")
        if kind == "message":
            messages.append(_message(item, i))
        elif kind == "function_call":
            call = {
                "id": item.get("call_id") or item.get("id") or f"call_{i}",
                "type": "function",
                "function": {"name": item.get("name"), "arguments": item.get("arguments", "")},
            }
            last = messages[-1] if messages else None
            if last is not None and last["role"] == "assistant" and last.get("tool_calls"):
                last["tool_calls"].append(call)
            else:
                messages.append({"role": "assistant", "content": "", "tool_calls": [call]})
        elif kind == "function_call_output":
            output = item.get("output")
            text = output if isinstance(output, str) else _text_of(output, i)
            messages.append({"role": "tool", "tool_call_id": item.get("call_id"), "content": text})
        elif kind == "reasoning":
            continue
        else:
            raise APIError(
                f"input[{i}]: item type {kind!r} is not supported; send message, "
                "function_call, function_call_output or reasoning items.",
                400,
                f"input[{i}].type",
            )
    return messages


def _message(item: dict[str, Any], i: int) -> dict[str, Any]:
    role = item.get("role")
    if role not in ("user", "assistant", "system", "developer"):
        raise APIError(
            f"input[{i}].role must be user, assistant, system or developer (got {role!r})",
            400,
            f"input[{i}].role",
        )
    content = item.get("content")
    text = content if isinstance(content, str) else _text_of(content, i)
    return {"role": "system" if role == "developer" else role, "content": text}


def _text_of(parts: Any, i: int) -> str:
    if not isinstance(parts, list):
        raise APIError(
            f"input[{i}].content must be a string or a list of text parts",
            400,
            f"input[{i}].content",
        )
    texts = []
    for j, part in enumerate(parts):
        kind = part.get("type") if isinstance(part, dict) else None
        if kind not in ("input_text", "output_text", "text") or not isinstance(
            part.get("text"), str
        ):
            raise APIError(
                f"input[{i}].content[{j}]: only text parts are supported (got type {kind!r}); "
                "send input_text parts or a string.",
                400,
                f"input[{i}].content[{j}]",
            )
        texts.append(part["text"])
    return "\n".join(texts)


def to_chat_request(
    req: ResponsesRequest, history: list[dict[str, Any]], messages: list[dict[str, Any]]
) -> ChatCompletionRequest:
    """The chat request that generates this response (``history``: a stored conversation)."""
    system = [{"role": "system", "content": req.instructions}] if req.instructions else []
    all_messages = [*system, *history, *messages]
    if not all_messages:
        raise APIError("input is required: send a string or a list of input items.", 400, "input")
    fields: dict[str, Any] = {name: getattr(req, name) for name in _PASSTHROUGH}
    return ChatCompletionRequest(
        model=req.model,
        messages=[ChatMessage(**m) for m in all_messages],
        max_completion_tokens=req.max_output_tokens,
        temperature=req.temperature,
        top_p=req.top_p,
        tools=chat_tools(req.tools),
        tool_choice=chat_tool_choice(req.tool_choice),
        response_format=chat_response_format(req.text),
        cache_salt=req.cache_salt,
        priority=req.priority,
        **fields,
    )
