"""The records that cross the engine-client seam (``engine_client.py``): what the engine
returns to callers (offline ``LLM``, the API server) and the load it reports. The core
builds them; callers never import the core's own records."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class Logprobs:
    """Log-probabilities at one position: the chosen token's and the top ``k``."""

    token_id: int
    logprob: float
    rank: int  # 1 = most likely
    top_token_ids: list[int] = field(default_factory=list)
    top_logprobs: list[float] = field(default_factory=list)


@dataclass
class SchedulerStats:
    """The scheduler's load at one step (gauges and counters since start)."""

    num_running: int
    num_waiting: int
    kv_cache_usage: float  # fraction of usable blocks referenced by requests
    num_preemptions: int  # since start
    prefix_cache_queries: int  # prompt tokens looked up in the prefix cache, since start
    prefix_cache_hits: int  # of those, tokens found
    num_free_blocks: int  # evictable cached blocks included
    num_total_blocks: int  # usable blocks (the reserved null block excluded)
    # LoRA: --max-loras (0: LoRA off) and the adapters of running / waiting requests.
    max_loras: int = 0
    running_lora_adapters: tuple[str, ...] = ()
    waiting_lora_adapters: tuple[str, ...] = ()

    @property
    def prefix_cache_hit_rate(self) -> float:
        return (
            self.prefix_cache_hits / self.prefix_cache_queries if self.prefix_cache_queries else 0.0
        )


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
