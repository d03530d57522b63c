"""Bounds on every request field, checked at the edge before any template, tokenizer or
engine work: a request that fails here costs microseconds and is never queued.

Pydantic (``protocol.py``) checks types; this module checks sizes and ranges that depend on
the server (``--max-n``, ``max_model_len``, ``--max-logprobs``, the vocabulary). Each
failure is an ``APIError`` 400 whose message names the field and the allowed range.
Ranges that ``SamplingParams.validate`` owns (``top_p`` in (0, 1], penalties, ...) are
checked there, still before the request is queued; only non-finite numbers are caught
here already, so a ``NaN`` never reaches arithmetic.
"""

from __future__ import annotations

import inspect
import math
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from engine.entrypoints.openai.errors import APIError
from engine.entrypoints.openai.prompt_bounds import chat_text_chars, check_prompt_chars
from engine.entrypoints.openai.protocol import (
    ChatCompletionRequest,
    CompletionRequest,
    SamplingFields,
)

MAX_STOP_STRINGS = 64
MAX_STOP_STRING_CHARS = 1024
MAX_STOP_TOKEN_IDS = 64
MAX_PROMPTS_PER_REQUEST = 64
MAX_CACHE_SALT_CHARS = 256
MAX_TEMPLATE_KWARGS = 32
# torch.Generator.manual_seed accepts [-2**63, 2**64 - 1]; outside it the engine step fails.
SEED_RANGE = (-(2**63), 2**64 - 1)
PRIORITY_RANGE = (-(2**31), 2**31 - 1)
TOP_K_MAX = 2**31 - 1
CHAT_ROLES = frozenset({"system", "developer", "user", "assistant", "tool", "function"})
_FLOAT_FIELDS = (
    "temperature",
    "top_p",
    "min_p",
    "presence_penalty",
    "frequency_penalty",
    "repetition_penalty",
)
_TEMPLATE_KWARG_NAME = re.compile(r"^[A-Za-z][A-Za-z0-9_]{0,63}$")
# Arguments of ``apply_chat_template`` itself (and of the call that renders it): a request
# must not reach them through chat_template_kwargs (tokenize=True, another template, ...).
_RESERVED_TEMPLATE_KWARGS = frozenset(
    {
        "conversation", "messages", "tools", "documents", "chat_template", "tokenize",
        "add_generation_prompt", "continue_final_message", "padding", "truncation",
        "max_length", "return_tensors", "return_dict", "return_assistant_tokens_mask",
        "tokenizer_kwargs", "processor_kwargs", "kwargs", "self",
    }
)  # fmt: skip


@dataclass(frozen=True)
class RequestLimits:
    """The server's bounds on one request (built once per app)."""

    max_n: int
    max_model_len: int
    max_logprobs: int
    vocab_size: int
    trust_request_chat_template: bool = False
    reserved_template_kwargs: frozenset[str] = _RESERVED_TEMPLATE_KWARGS
    # Longest prompt text that could still fit in max_model_len (``prompt_bounds``).
    max_prompt_chars: int | None = None


def reserved_template_kwargs(tokenizer: Any) -> frozenset[str]:
    """The fixed reserved names plus every parameter of this tokenizer's
    ``apply_chat_template`` (so a newer transformers' options are covered too)."""
    names = set(_RESERVED_TEMPLATE_KWARGS)
    method = getattr(tokenizer, "apply_chat_template", None)
    if method is not None:
        try:
            names |= set(inspect.signature(method).parameters)
        except (TypeError, ValueError):
            pass
    return frozenset(names)


def _bad(message: str, param: str) -> APIError:
    return APIError(message, 400, param)


def _in_range(name: str, value: int | None, low: int, high: int, hint: str = "") -> None:
    if value is not None and not low <= value <= high:
        raise _bad(f"{name} must be in [{low}, {high}]{hint}, got {value}", name)


def validate_sampling_fields(req: SamplingFields, limits: RequestLimits) -> None:
    """Fields shared by chat and completion requests."""
    _in_range("n", req.n, 1, limits.max_n, " (the server's --max-n)")
    _in_range("max_tokens", req.max_tokens, 1, limits.max_model_len, " (max_model_len)")
    _in_range("min_tokens", req.min_tokens, 0, limits.max_model_len, " (max_model_len)")
    for name in _FLOAT_FIELDS:
        value = getattr(req, name)
        if value is not None and not math.isfinite(value):
            raise _bad(f"{name} must be a finite number, got {value}", name)
    _in_range("seed", req.seed, *SEED_RANGE)
    _in_range("priority", req.priority, *PRIORITY_RANGE)
    _in_range("top_k", req.top_k, -1, TOP_K_MAX, " (-1 or 0: off)")
    _check_stop(req.stop)
    if req.stream_options is not None and not req.stream:
        raise _bad("stream_options is only allowed with stream: true", "stream_options")
    if req.stop_token_ids is not None:
        if len(req.stop_token_ids) > MAX_STOP_TOKEN_IDS:
            raise _bad(
                f"stop_token_ids has {len(req.stop_token_ids)} entries; at most "
                f"{MAX_STOP_TOKEN_IDS} are accepted",
                "stop_token_ids",
            )
        _check_token_ids("stop_token_ids", req.stop_token_ids, limits.vocab_size)
    if req.logit_bias is not None:
        _check_logit_bias(req.logit_bias, limits.vocab_size)
    if req.cache_salt is not None and not 1 <= len(req.cache_salt) <= MAX_CACHE_SALT_CHARS:
        raise _bad(
            f"cache_salt must be 1 to {MAX_CACHE_SALT_CHARS} characters, got {len(req.cache_salt)}",
            "cache_salt",
        )


def _check_stop(stop: str | list[str] | None) -> None:
    if stop is None:
        return
    stops = [stop] if isinstance(stop, str) else stop
    if len(stops) > MAX_STOP_STRINGS:
        raise _bad(
            f"stop has {len(stops)} strings; at most {MAX_STOP_STRINGS} are accepted", "stop"
        )
    for i, text in enumerate(stops):
        if not 1 <= len(text) <= MAX_STOP_STRING_CHARS:
            raise _bad(
                f"stop[{i}] must be 1 to {MAX_STOP_STRING_CHARS} characters long, got {len(text)}",
                "stop",
            )


def _check_logit_bias(logit_bias: Mapping[str, float], vocab_size: int) -> None:
    """OpenAI's rules: keys are token ids (as strings), values lie in [-100, 100]."""
    for key, value in logit_bias.items():
        try:
            token = int(key)
        except ValueError:
            raise _bad(
                f"logit_bias key {key[:32]!r} is not a token id; keys are token ids as "
                'strings, e.g. {"50256": -100}',
                "logit_bias",
            ) from None
        if not 0 <= token < vocab_size:
            raise _bad(
                f"logit_bias key {token} is out of range; token ids must be in [0, {vocab_size})",
                "logit_bias",
            )
        if not (math.isfinite(value) and -100 <= value <= 100):
            raise _bad(
                f"logit_bias[{key!r}] = {value} is out of range; biases must be in [-100, 100]",
                "logit_bias",
            )


def _check_token_ids(name: str, ids: list[int], vocab_size: int) -> None:
    for i, token in enumerate(ids):
        if not 0 <= token < vocab_size:
            raise _bad(
                f"{name}[{i}] = {token} is out of range; token ids must be in [0, {vocab_size})",
                name,
            )


def validate_completion_request(req: CompletionRequest, limits: RequestLimits) -> None:
    validate_sampling_fields(req, limits)
    _in_range("logprobs", req.logprobs, 0, limits.max_logprobs, " (--max-logprobs)")
    _in_range("best_of", req.best_of, 1, limits.max_n, " (the server's --max-n)")
    prompt = req.prompt
    if isinstance(prompt, str):
        prompts: list[Any] = [prompt]
    elif prompt and isinstance(prompt[0], int):
        prompts = [prompt]
    else:
        prompts = list(prompt)
    if not prompts:
        raise _bad("prompt must not be empty; send a string or a list of token ids", "prompt")
    if len(prompts) > MAX_PROMPTS_PER_REQUEST:
        raise _bad(
            f"prompt is a batch of {len(prompts)} prompts; at most "
            f"{MAX_PROMPTS_PER_REQUEST} per request are accepted (send several requests)",
            "prompt",
        )
    for item in prompts:
        if len(item) == 0:
            raise _bad("prompt must not be empty; send at least one character or token", "prompt")
        if not isinstance(item, str):
            _check_token_ids("prompt", item, limits.vocab_size)
        elif limits.max_prompt_chars is not None:
            check_prompt_chars(len(item), limits.max_prompt_chars, limits.max_model_len, "prompt")


def validate_chat_request(req: ChatCompletionRequest, limits: RequestLimits) -> None:
    validate_sampling_fields(req, limits)
    _in_range(
        "max_completion_tokens", req.max_completion_tokens, 1, limits.max_model_len,
        " (max_model_len)",
    )  # fmt: skip
    _in_range("top_logprobs", req.top_logprobs, 0, limits.max_logprobs, " (--max-logprobs)")
    if req.top_logprobs is not None and not req.logprobs:
        raise _bad("top_logprobs needs logprobs: true", "top_logprobs")
    validate_messages(req.messages)
    if limits.max_prompt_chars is not None:
        num_chars = chat_text_chars(req.messages)
        check_prompt_chars(num_chars, limits.max_prompt_chars, limits.max_model_len, "messages")
    _check_tool_names(req.tools)
    if req.chat_template is not None and not limits.trust_request_chat_template:
        raise APIError(
            "chat_template in the request is refused: this server renders only its own "
            "template (the operator can allow request templates with "
            "--trust-request-chat-template)",
            400,
            "chat_template",
        )
    validate_template_kwargs(req.chat_template_kwargs, limits.reserved_template_kwargs)


def _check_tool_names(tools: list[dict[str, Any]] | None) -> None:
    """Each function name once (the shapes themselves are checked by ``tool_choice``)."""
    seen: set[str] = set()
    for i, tool in enumerate(tools or []):
        fn = tool.get("function")
        name = fn.get("name") if isinstance(fn, dict) else None
        if not isinstance(name, str):
            continue
        if name in seen:
            raise _bad(
                f"tools[{i}].function.name {name[:64]!r} is used by an earlier tool; "
                "give each tool a unique name",
                "tools",
            )
        seen.add(name)


def validate_messages(messages: list[Any]) -> None:
    """Roles from the chat vocabulary; content a string, text parts or (assistant) none."""
    if not messages:
        raise _bad("messages must hold at least one message", "messages")
    for i, msg in enumerate(messages):
        if msg.role not in CHAT_ROLES:
            raise _bad(
                f"messages[{i}].role {msg.role[:32]!r} is not a chat role; use one of "
                f"{', '.join(sorted(CHAT_ROLES))}",
                f"messages[{i}].role",
            )
        if msg.content is None and msg.role not in ("assistant", "function", "tool"):
            raise _bad(f"messages[{i}].content is required for role {msg.role!r}", "messages")
        if isinstance(msg.content, list):
            for j, part in enumerate(msg.content):
                if not isinstance(part.get("type"), str):
                    raise _bad(
                        f"messages[{i}].content[{j}] needs a string 'type' (e.g. 'text')",
                        f"messages[{i}].content",
                    )


def validate_template_kwargs(kwargs: Mapping[str, Any] | None, reserved: frozenset[str]) -> None:
    """Template variables only: plain names that are not options of the renderer itself."""
    if kwargs is None:
        return
    if len(kwargs) > MAX_TEMPLATE_KWARGS:
        raise _bad(
            f"chat_template_kwargs has {len(kwargs)} keys; at most {MAX_TEMPLATE_KWARGS}",
            "chat_template_kwargs",
        )
    for key in kwargs:
        if not _TEMPLATE_KWARG_NAME.match(key):
            raise _bad(
                f"chat_template_kwargs key {key[:64]!r} is not a template variable name "
                "(letters, digits, underscores; at most 64 characters)",
                "chat_template_kwargs",
            )
        if key in reserved:
            raise _bad(
                f"chat_template_kwargs must not set {key!r}: it is an option of the template "
                "renderer, not a template variable; use the request fields instead",
                "chat_template_kwargs",
            )
