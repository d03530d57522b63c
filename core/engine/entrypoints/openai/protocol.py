"""Request and response bodies of the OpenAI-compatible API (pydantic models).

Requests allow unknown fields (OpenAI clients send fields this server does not use) but
type-check the known ones; engine-specific fields (``top_k``, ``min_p``, ``cache_salt``,
...) are what clients pass through ``extra_body``. A field left unset stays ``None`` so the
model's generation defaults (``engine.default_sampling_params()``) fill it.

Integer and boolean fields are strict, as OpenAI's are: ``true``, ``"4"`` or ``4.0`` for
``max_tokens`` (or a token id) is a 400, not silently read as 1 or 4.
"""

from __future__ import annotations

import time
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, StrictBool, StrictInt


class OpenAIBase(BaseModel):
    model_config = ConfigDict(extra="allow")


class StreamOptions(OpenAIBase):
    include_usage: StrictBool | None = False
    # vLLM's: with include_usage, every chunk carries the usage so far too.
    continuous_usage_stats: StrictBool | None = False


def continuous_usage(options: StreamOptions | None) -> bool:
    return options is not None and bool(options.include_usage and options.continuous_usage_stats)


class SamplingFields(OpenAIBase):
    """Fields shared by chat and completion requests."""

    model: str | None = None
    n: StrictInt = 1
    max_tokens: StrictInt | None = None
    temperature: float | None = None
    top_p: float | None = None
    presence_penalty: float | None = None
    frequency_penalty: float | None = None
    seed: StrictInt | None = None
    stop: str | list[str] | None = None
    stream: StrictBool = False
    stream_options: StreamOptions | None = None
    user: str | None = None
    # engine fields (extra_body)
    top_k: StrictInt | None = None
    min_p: float | None = None
    repetition_penalty: float | None = None
    min_tokens: StrictInt = 0
    ignore_eos: StrictBool = False
    cache_salt: str | None = None
    priority: StrictInt = 0
    stop_token_ids: list[StrictInt] | None = None
    # OpenAI: token id (a string key in JSON) -> bias in [-100, 100] added to its logit.
    logit_bias: dict[str, float] | None = None
    skip_special_tokens: StrictBool = True
    include_stop_str_in_output: StrictBool = False
    # structured outputs: exactly one of json, regex, choice, grammar (or OpenAI's
    # response_format json_schema / json_object)
    structured_outputs: dict[str, Any] | None = None
    response_format: dict[str, Any] | None = None


class ChatMessage(OpenAIBase):
    role: str
    content: str | list[dict[str, Any]] | None = None
    name: str | None = None
    tool_calls: list[dict[str, Any]] | None = None
    tool_call_id: str | None = None


class ChatCompletionRequest(SamplingFields):
    messages: list[ChatMessage] = Field(min_length=1)
    max_completion_tokens: StrictInt | None = None
    logprobs: StrictBool = False
    top_logprobs: StrictInt | None = None
    tools: list[dict[str, Any]] | None = None
    tool_choice: str | dict[str, Any] | None = None
    parallel_tool_calls: bool | None = None  # None: true (several calls allowed)
    chat_template: str | None = None
    chat_template_kwargs: dict[str, Any] | None = None
    add_generation_prompt: StrictBool = True


class CompletionRequest(SamplingFields):
    prompt: str | list[str] | list[StrictInt] | list[list[StrictInt]]
    logprobs: StrictInt | None = None
    echo: StrictBool = False
    suffix: str | None = None
    best_of: StrictInt | None = None


class UsageInfo(BaseModel):
    prompt_tokens: int = 0
    completion_tokens: int = 0
    total_tokens: int = 0
    prompt_tokens_details: dict[str, int] | None = None


class TopLogprob(BaseModel):
    token: str
    logprob: float
    bytes: list[int] | None = None


class ChatTokenLogprob(TopLogprob):
    top_logprobs: list[TopLogprob] = Field(default_factory=list)


class ChatLogprobs(BaseModel):
    content: list[ChatTokenLogprob] | None = None


class CompletionLogprobs(BaseModel):
    tokens: list[str] = Field(default_factory=list)
    token_logprobs: list[float | None] = Field(default_factory=list)
    top_logprobs: list[dict[str, float] | None] = Field(default_factory=list)
    text_offset: list[int] = Field(default_factory=list)


class FunctionCall(BaseModel):
    name: str
    arguments: str  # a JSON object as a string


class ToolCallItem(BaseModel):
    id: str
    type: Literal["function"] = "function"
    function: FunctionCall


class AssistantMessage(BaseModel):
    role: Literal["assistant"] = "assistant"
    content: str | None = None
    # The think section (--reasoning-parser); ``reasoning`` is the same text under the
    # newer field name, so clients of either convention find it.
    reasoning_content: str | None = None
    reasoning: str | None = None
    tool_calls: list[ToolCallItem] | None = None


class ChatChoice(BaseModel):
    index: int
    message: AssistantMessage
    logprobs: ChatLogprobs | None = None
    finish_reason: str | None = None
    stop_reason: int | str | None = None


class ChatCompletionResponse(BaseModel):
    id: str
    object: Literal["chat.completion"] = "chat.completion"
    created: int = Field(default_factory=lambda: int(time.time()))
    model: str
    choices: list[ChatChoice]
    usage: UsageInfo


class DeltaFunctionCall(BaseModel):
    name: str | None = None
    arguments: str | None = None


class DeltaToolCall(BaseModel):
    """A streamed piece of tool call ``index``: the first carries id, type and name."""

    index: int
    id: str | None = None
    type: Literal["function"] | None = None
    function: DeltaFunctionCall | None = None


class DeltaMessage(BaseModel):
    role: str | None = None
    content: str | None = None
    reasoning_content: str | None = None
    reasoning: str | None = None
    tool_calls: list[DeltaToolCall] | None = None


class ChatChunkChoice(BaseModel):
    index: int
    delta: DeltaMessage
    logprobs: ChatLogprobs | None = None
    finish_reason: str | None = None
    stop_reason: int | str | None = None


class ChatCompletionChunk(BaseModel):
    id: str
    object: Literal["chat.completion.chunk"] = "chat.completion.chunk"
    created: int
    model: str
    choices: list[ChatChunkChoice]
    usage: UsageInfo | None = None


class CompletionChoice(BaseModel):
    index: int
    text: str
    logprobs: CompletionLogprobs | None = None
    finish_reason: str | None = None
    stop_reason: int | str | None = None


class CompletionResponse(BaseModel):
    id: str
    object: Literal["text_completion"] = "text_completion"
    created: int = Field(default_factory=lambda: int(time.time()))
    model: str
    choices: list[CompletionChoice]
    usage: UsageInfo | None = None


class ModelCard(BaseModel):
    id: str
    object: Literal["model"] = "model"
    created: int = Field(default_factory=lambda: int(time.time()))
    owned_by: str = "engine"
    root: str | None = None
    parent: str | None = None  # a LoRA adapter's base model (vLLM's field)
    max_model_len: int | None = None


class ModelList(BaseModel):
    object: Literal["list"] = "list"
    data: list[ModelCard]


class TokenizeRequest(OpenAIBase):
    model: str | None = None
    prompt: str | None = None
    messages: list[ChatMessage] | None = None
    add_special_tokens: StrictBool = True
    add_generation_prompt: StrictBool = True
    chat_template_kwargs: dict[str, Any] | None = None


class TokenizeResponse(BaseModel):
    tokens: list[int]
    count: int
    max_model_len: int


class DetokenizeRequest(OpenAIBase):
    model: str | None = None
    tokens: list[StrictInt]


class DetokenizeResponse(BaseModel):
    prompt: str
