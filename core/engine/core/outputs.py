"""What the engine core returns each step (``EngineCoreOutput``) and its counters
(``SchedulerStats``)."""

from __future__ import annotations

from dataclasses import dataclass

from engine.core.request import ReqId
from engine.core.scheduler_output import Logprobs


@dataclass
class EngineCoreOutput:
    """One request's news from one step: tokens sampled, logprobs, and whether it ended.

    Times are ``time.monotonic()`` seconds, for the metrics layer: queue time is
    ``first_scheduled_time - arrival_time``, time to first token
    ``first_token_time - arrival_time``, and ``timestamp`` is when this output was made
    (the time of its last token).
    """

    req_id: ReqId
    new_token_ids: list[int]
    new_logprobs: list[Logprobs] | None = None
    new_prompt_logprobs: list[Logprobs] | None = None
    finish_reason: str | None = None  # "stop", "length", "abort", "error" once finished
    stop_reason: int | str | None = None  # the stop token id that ended it, if any
    num_cached_tokens: int = 0
    # Added compatibly (not in the interfaces page): timing and preemption counts.
    arrival_time: float = 0.0
    first_scheduled_time: float | None = None
    first_token_time: float | None = None
    timestamp: float = 0.0
    num_preemptions: int = 0
    pooled: list[float] | None = None  # a pooling model's vector, on the finishing output

    @property
    def finished(self) -> bool:
        return self.finish_reason is not None


@dataclass
class SchedulerStats:
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
