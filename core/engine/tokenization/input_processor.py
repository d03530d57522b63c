"""The front end of every request: turn a caller's prompts and sampling params into
validated core requests.

Tokenizes, validates, applies the engine's limits and defaults, and fans out (several
prompts times n: ``engine.fan_out``), once, where the request enters: the HTTP routes and
the offline ``LLM`` both come through here, and the engine loop trusts what it gets. A bad
field raises ``RequestValidationError`` naming it (``param``). Thread-safe and side-effect
free, so the async front end runs it off the event loop and reports bad input at once,
before the request reaches the engine.
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from engine.core.request import ReqId, Request
from engine.errors import RequestValidationError
from engine.fan_out import child_params, child_req_ids, prompt_request_ids
from engine.sampling_params import RequestOutputKind, SamplingParams
from engine.tokenization import encode_prompt

if TYPE_CHECKING:
    from engine.lora.request import LoRARequest

PromptType = str | list[int] | Mapping[str, Any]
CONTEXT_LENGTH_EXCEEDED = "context_length_exceeded"


@dataclass
class PreparedRequest:
    """A validated prompt of a user request and the core requests it fans out into."""

    request_id: str
    prompt: str | None
    prompt_token_ids: list[int]
    params: SamplingParams
    core_requests: list[Request]
    arrival_time: float

    @property
    def lora_request(self) -> LoRARequest | None:
        return self.core_requests[0].lora_request

    @property
    def cache_salt(self) -> str | None:
        return self.core_requests[0].cache_salt

    def set_output_kind(self, kind: RequestOutputKind) -> None:
        """How the caller wants its outputs (cumulative, deltas, final only): for the
        request and each of its core requests."""
        self.params.output_kind = kind
        for request in self.core_requests:
            request.sampling_params.output_kind = kind


class InputProcessor:
    """Tokenizes prompts and applies the engine's limits and defaults to sampling params."""

    def __init__(
        self,
        tokenizer: Any,
        max_model_len: int,
        vocab_size: int,
        eos_token_ids: list[int],
        max_logprobs: int = 20,
    ) -> None:
        self.tokenizer = tokenizer
        self.max_model_len = max_model_len
        self.vocab_size = vocab_size
        self.eos_token_ids = list(eos_token_ids)
        self.max_logprobs = max_logprobs

    def tokenize(self, prompt: PromptType) -> tuple[str | None, list[int]]:
        """(prompt text or None, token ids) of a string, id list or prompt dict."""
        if isinstance(prompt, str):
            return prompt, encode_prompt(self.tokenizer, prompt)
        if isinstance(prompt, Mapping):
            if "prompt_token_ids" in prompt:
                ids = prompt["prompt_token_ids"]
                text = prompt.get("prompt")
                return text, self._check_ids(ids)
            if "prompt" in prompt:
                add_special = bool(prompt.get("add_special_tokens", True))
                text = prompt["prompt"]
                if not isinstance(text, str):
                    raise RequestValidationError("prompt['prompt'] must be a string", "prompt")
                return text, encode_prompt(self.tokenizer, text, add_special)
            raise RequestValidationError(
                "a prompt dict needs 'prompt' (text) or 'prompt_token_ids' (list of ints); "
                f"got keys {sorted(prompt)}",
                "prompt",
            )
        if isinstance(prompt, (list, tuple)):
            return None, self._check_ids(prompt)
        raise RequestValidationError(
            f"a prompt is a string, a list of token ids or a dict; got {type(prompt).__name__}",
            "prompt",
        )

    def _check_ids(self, ids: Any) -> list[int]:
        if not isinstance(ids, (list, tuple)) or not all(
            isinstance(i, int) and not isinstance(i, bool) for i in ids
        ):
            raise RequestValidationError("prompt_token_ids must be a list of integers", "prompt")
        bad = [i for i in ids if not 0 <= i < self.vocab_size]
        if bad:
            raise RequestValidationError(
                f"prompt_token_ids contains id(s) {bad[:5]} outside the vocabulary "
                f"[0, {self.vocab_size}); use ids the model's tokenizer produces",
                "prompt",
            )
        return list(ids)

    def resolve_params(self, params: SamplingParams, num_prompt_tokens: int) -> SamplingParams:
        """Validate; fill EOS ids and a missing max_tokens; check the context fits."""
        params.validate(self.max_logprobs)  # RequestValidationError naming the field
        outside = [t for t in (params.logit_bias or {}) if t >= self.vocab_size]
        if outside:
            raise RequestValidationError(
                f"logit_bias has token id(s) {outside[:5]} outside the vocabulary "
                f"[0, {self.vocab_size}); use ids the model's tokenizer produces",
                "logit_bias",
            )
        changes: dict[str, Any] = {}
        if not params.eos_token_ids:
            changes["eos_token_ids"] = list(self.eos_token_ids)
        max_tokens = params.max_tokens
        if max_tokens is None:
            max_tokens = self.max_model_len - num_prompt_tokens
            if max_tokens < 1:
                raise RequestValidationError(
                    f"This model's maximum context length is {self.max_model_len} tokens, but "
                    f"the prompt has {num_prompt_tokens} tokens, which leaves no room to "
                    "generate; shorten the prompt (or raise --max-model-len)",
                    "prompt",
                    CONTEXT_LENGTH_EXCEEDED,
                )
            changes["max_tokens"] = max_tokens
        total = num_prompt_tokens + max_tokens
        if total > self.max_model_len:
            raise RequestValidationError(
                f"This model's maximum context length is {self.max_model_len} tokens, but "
                f"{max_tokens} output tokens were requested with a prompt of "
                f"{num_prompt_tokens} tokens ({total} in total); lower max_tokens to at most "
                f"{max(self.max_model_len - num_prompt_tokens, 0)} or shorten the prompt",
                "max_tokens",
                CONTEXT_LENGTH_EXCEEDED,
            )
        return params.clone(**changes)

    def prepare(
        self,
        request_id: str,
        prompt: PromptType,
        params: SamplingParams,
        priority: int = 0,
        cache_salt: str | None = None,
        lora_request: LoRARequest | None = None,
    ) -> PreparedRequest:
        """Tokenize and validate one prompt; build one core ``Request`` per sample (n)."""
        text, prompt_ids = self.tokenize(prompt)
        if not prompt_ids:
            raise RequestValidationError(
                "the prompt is empty (0 tokens); pass at least one token of text", "prompt"
            )
        resolved = self.resolve_params(params, len(prompt_ids))
        arrival = time.monotonic()
        core_requests = [
            Request(
                req_id=ReqId(req_id),
                prompt_token_ids=list(prompt_ids),
                sampling_params=child,
                priority=priority,
                cache_salt=cache_salt,
                lora_request=lora_request,
                arrival_time=arrival,
            )
            for req_id, child in zip(
                child_req_ids(request_id, resolved.n),
                child_params(resolved, resolved.n),
                strict=True,
            )
        ]
        return PreparedRequest(request_id, text, prompt_ids, resolved, core_requests, arrival)

    def prepare_all(
        self,
        request_id: str,
        prompts: Sequence[PromptType],
        params: Sequence[SamplingParams],
        priority: int = 0,
        cache_salts: Sequence[str | None] | None = None,
        lora_requests: Sequence[LoRARequest | None] | None = None,
    ) -> list[PreparedRequest]:
        """One ``PreparedRequest`` per prompt (ids from ``prompt_request_ids``), with the
        params, cache salt and adapter of the same position (None: none for any); all
        valid, or an error for the first that is not."""
        if not prompts:
            raise RequestValidationError("no prompts; pass at least one", "prompt")
        num = len(prompts)
        salts = cache_salts if cache_salts is not None else [None] * num
        loras = lora_requests if lora_requests is not None else [None] * num
        ids = prompt_request_ids(request_id, num)
        return [
            self.prepare(rid, prompt, p, priority, salt, lora)
            for rid, prompt, p, salt, lora in zip(ids, prompts, params, salts, loras, strict=True)
        ]
