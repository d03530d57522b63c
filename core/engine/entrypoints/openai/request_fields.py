"""OpenAI and vLLM request fields this server does not implement: refused or ignored.

A field that would change the output (``audio``, ``use_beam_search``, ``bad_words``...)
is a 400 naming it whenever it is set to anything but its neutral value, so a client never
gets an answer that silently ignored what it asked for. A field with no effect on the
output (``metadata``, ``store``, ``service_tier``...) is accepted and logged once. Any
other unknown field is accepted and logged once too (clients send fields of newer API
versions). docs/serving.md has the full table, supported fields included.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from engine.entrypoints.openai.errors import APIError
from engine.entrypoints.openai.stats_logger import ignored_fields_message

_NONE: tuple[Any, ...] = (None,)
_OFF: tuple[Any, ...] = (None, False)

# field -> (neutral values that are accepted, what to do instead). Both endpoints.
REFUSED: Mapping[str, tuple[tuple[Any, ...], str]] = {
    "use_beam_search": (_OFF, "beam search is not implemented; sample with n instead"),
    "length_penalty": ((None, 1, 1.0), "it only applies to beam search, which is not implemented"),
    "allowed_token_ids": (_NONE, "use logit_bias or structured_outputs"),
    "bad_words": (_NONE, "use logit_bias (-100) on their token ids"),
    "truncate_prompt_tokens": (_NONE, "shorten the prompt on the client"),
    "prompt_logprobs": (_NONE, "completions return prompt logprobs with echo and logprobs"),
    "spaces_between_special_tokens": ((None, True), "special tokens are always spaced"),
    "logits_processors": (_NONE, "custom logits processors are not supported"),
    "return_tokens_as_token_ids": (_OFF, "use /tokenize on the text"),
    "return_token_ids": (_OFF, "use /tokenize on the text"),
    "vllm_xargs": (_NONE, "vLLM's extra arguments are not supported"),
    "kv_transfer_params": (_NONE, "disaggregated prefill is not supported"),
    "mm_processor_kwargs": (_NONE, "multimodal input is not supported"),
    "thinking_token_budget": (_NONE, "cap the whole output with max_tokens"),
}
REFUSED_CHAT: Mapping[str, tuple[tuple[Any, ...], str]] = {
    "audio": (_NONE, "audio output is not supported"),
    "modalities": ((None, ["text"]), 'only text output is supported: leave it unset or ["text"]'),
    "functions": (_NONE, "send tools instead (the functions API is deprecated)"),
    "function_call": (_NONE, "send tool_choice instead (the functions API is deprecated)"),
    "web_search_options": (_NONE, "web search is not supported"),
    "reasoning_effort": (_NONE, "use chat_template_kwargs (e.g. enable_thinking) instead"),
    "verbosity": (_NONE, "ask for the length in the prompt or cap it with max_tokens"),
    "echo": (_OFF, "echo is supported on /v1/completions"),
    "continue_final_message": (_OFF, "continuing the last assistant message is not supported"),
    "add_special_tokens": (_OFF, "the chat template adds the special tokens"),
    "documents": (_NONE, "put the documents in the messages"),
}
# Accepted with no effect on the output (named in the request's one log line).
IGNORED: frozenset[str] = frozenset(
    {
        "metadata", "store", "service_tier", "prompt_cache_key", "safety_identifier",
        "prediction", "request_id",
    }
)  # fmt: skip


def check_extra_fields(
    extra: Mapping[str, Any] | None, chat: bool, warn_once: Callable[[str], None]
) -> None:
    """400 for a refused field set to a non-neutral value; the ignored rest (fields with
    no effect and unknown ones) in at most one log line per request, however many."""
    if not extra:
        return
    refused = {**REFUSED, **REFUSED_CHAT} if chat else REFUSED
    for name in sorted(refused.keys() & extra.keys()):
        neutral, instead = refused[name]
        if extra[name] in neutral:
            continue
        where = "/v1/chat/completions" if chat else "/v1/completions"
        raise APIError(
            f"{name} is not supported by this server on {where} ({instead}); leave it unset",
            400,
            name,
        )
    # guided_* are removed fields: structured_request.check_removed_fields answers them.
    ignored = [n for n in extra if n not in refused and not n.startswith("guided_")]
    if not ignored:
        return
    no_effect = [n for n in ignored if n in IGNORED]
    unknown = [n for n in ignored if n not in IGNORED]
    parts = []
    if no_effect:
        verb = "has" if len(no_effect) == 1 else "have"
        names = ", ".join(repr(n) for n in no_effect)
        parts.append(f"Request fields {names} {verb} no effect on this server")
    if unknown:
        parts.append(ignored_fields_message(unknown, len(unknown)))
    warn_once("; ".join(parts))
