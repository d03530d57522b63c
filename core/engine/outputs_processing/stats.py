"""Records the front end produces for metrics: per step, per finished request, cumulative.

The engine thread builds one ``IterationStats`` per step and hands it to stats listeners
(the server's Prometheus exporter). ``EngineCounters`` keeps running totals that
``LLMEngine.counters()`` returns as a snapshot.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any


@dataclass
class RequestTiming:
    """Monotonic timestamps of one core request (seconds, ``time.monotonic``)."""

    arrival_time: float
    first_scheduled_time: float | None = None
    first_token_time: float | None = None
    last_token_time: float | None = None
    finished_time: float | None = None


@dataclass
class FinishedRequestStats:
    """One finished core request, for latency histograms."""

    req_id: str
    finish_reason: str
    num_prompt_tokens: int
    num_generation_tokens: int
    num_cached_tokens: int
    e2e_latency: float
    queue_time: float | None  # arrival -> first scheduled
    time_to_first_token: float | None  # arrival -> first token
    prefill_time: float | None  # first scheduled -> first token
    decode_time: float | None  # first token -> last token
    mean_time_per_output_token: float | None


@dataclass
class IterationStats:
    """What one engine step did: counts and latency samples taken during that step."""

    scheduler: Any  # SchedulerStats after the step
    num_prompt_tokens: int = 0  # prompts that produced their first token this step
    num_generation_tokens: int = 0
    num_preemptions: int = 0  # new preemptions since the previous step
    time_to_first_tokens: list[float] = field(default_factory=list)
    inter_token_latencies: list[float] = field(default_factory=list)
    finished_requests: list[FinishedRequestStats] = field(default_factory=list)


@dataclass
class EngineCounters:
    """Running totals since the engine started."""

    num_prompt_tokens: int = 0
    num_generation_tokens: int = 0
    num_preemptions: int = 0
    num_requests_added: int = 0
    finished_by_reason: dict[str, int] = field(default_factory=dict)

    def add(self, it: IterationStats) -> None:
        self.num_prompt_tokens += it.num_prompt_tokens
        self.num_generation_tokens += it.num_generation_tokens
        self.num_preemptions += it.num_preemptions
        for fin in it.finished_requests:
            reason = fin.finish_reason
            self.finished_by_reason[reason] = self.finished_by_reason.get(reason, 0) + 1

    def snapshot(self) -> EngineCounters:
        return replace(self, finished_by_reason=dict(self.finished_by_reason))
