"""Results the engine returns to callers (offline ``LLM`` and the API server)."""

from __future__ import annotations

from dataclasses import dataclass, field

from engine.core.scheduler_output import Logprobs


@dataclass
class CompletionOutput:
    index: int
    text: str
    token_ids: list[int]
    finish_reason: str | None = None  # "stop", "length", "abort", "error"
    stop_reason: int | str | None = None
    logprobs: list[Logprobs] | None = None
    # Streaming: what this update added since the previous one.
    delta_text: str = ""
    delta_token_ids: list[int] = field(default_factory=list)
    delta_logprobs: list[Logprobs] | None = None

    @property
    def finished(self) -> bool:
        return self.finish_reason is not None


@dataclass
class RequestOutput:
    request_id: str
    prompt: str | None
    prompt_token_ids: list[int]
    outputs: list[CompletionOutput]
    finished: bool
    prompt_logprobs: list[Logprobs | None] | None = None
    num_cached_tokens: int = 0
    error: str | None = None  # set when the request failed inside the engine
    pooled: list[float] | None = None  # a pooling model's vector (embeddings), once finished
