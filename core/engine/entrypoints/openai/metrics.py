"""Prometheus metrics of one server (``/metrics``), in a registry owned by the app.

Names carry the ``engine:`` prefix and a ``model_name`` label. Gauges and cumulative
scheduler counters are read from ``engine.stats()`` at scrape time; token counts and
latency histograms come from the engine's per-step ``IterationStats`` (stats listener) or,
for an engine without that hook, from what the server itself observes per request.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from engine.outputs import SchedulerStats

# The engine client's ``stats`` (EngineClient.stats), read at scrape time
StatsFn = Callable[[], SchedulerStats]

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"

_LATENCY_BUCKETS = (
    0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0,
    2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0, 160.0, 640.0, 2560.0,
)  # fmt: skip
_ITL_BUCKETS = (
    0.001, 0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75,
    1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0,
)  # fmt: skip


API_REQUEST_KINDS = ("chat", "completion", "responses", "embeddings", "score", "rerank")
LORA_INFO_LABELS = ["max_lora", "running_lora_adapters", "waiting_lora_adapters"]


def lora_requests_info(prefix: str, stats: SchedulerStats) -> GaugeMetricFamily:
    """vLLM's ``lora_requests_info``: --max-loras and the adapters of running and waiting
    requests (comma-separated names) as labels, the scrape time as the value."""
    info = GaugeMetricFamily(
        f"{prefix}lora_requests_info", "Running stats on LoRA requests.", labels=LORA_INFO_LABELS
    )
    info.add_metric(
        [
            str(stats.max_loras),
            ",".join(stats.running_lora_adapters),
            ",".join(stats.waiting_lora_adapters),
        ],
        time.time(),
    )
    return info


class _SchedulerCollector(Collector):
    """Reads the scheduler's gauges and cumulative counters when Prometheus scrapes."""

    def __init__(self, model_name: str, stats_fn: StatsFn) -> None:
        self.model_name = model_name
        self.stats_fn = stats_fn

    def collect(self) -> Iterator[Metric]:
        try:
            stats = self.stats_fn()
        except Exception:  # a dead engine must not break /metrics
            stats = None
        if stats is None:
            return
        label = [self.model_name]

        def gauge(name: str, doc: str, value: float) -> GaugeMetricFamily:
            g = GaugeMetricFamily(f"engine:{name}", doc, labels=["model_name"])
            g.add_metric(label, value)
            return g

        def counter(name: str, doc: str, value: float) -> CounterMetricFamily:
            c = CounterMetricFamily(f"engine:{name}", doc, labels=["model_name"])
            c.add_metric(label, value)
            return c

        yield gauge("num_requests_running", "Requests in the running batch.", stats.num_running)
        yield gauge("num_requests_waiting", "Requests waiting to be scheduled.", stats.num_waiting)
        yield gauge(
            "kv_cache_usage_perc", "Fraction of KV cache blocks in use (0-1).", stats.kv_cache_usage
        )
        yield counter("num_preemptions", "Preemptions since start.", stats.num_preemptions)
        yield counter(
            "prefix_cache_queries", "Prompt tokens looked up in the prefix cache.",
            stats.prefix_cache_queries,
        )  # fmt: skip
        yield counter(
            "prefix_cache_hits", "Prompt tokens found in the prefix cache.", stats.prefix_cache_hits
        )
        yield lora_requests_info("engine:", stats)


@dataclass
class ThroughputTotals:
    """Plain running totals for the periodic stats log line."""

    num_prompt_tokens: int = 0
    num_generation_tokens: int = 0


class ServerMetrics:
    """All metrics of one app; thread-safe (the engine thread calls ``observe_iteration``)."""

    def __init__(self, model_name: str, stats_fn: StatsFn) -> None:
        self.model_name = model_name
        self.registry = CollectorRegistry()
        # Rendered after ``registry`` (``--metrics-compat``: the same values, other names).
        self.extra_registries: list[CollectorRegistry] = []
        self.totals = ThroughputTotals()
        self._lock = threading.Lock()
        self.engine_reports_iterations = False
        reg = self.registry
        labels = ["model_name"]
        self.prompt_tokens = Counter(
            "engine:prompt_tokens", "Prompt tokens processed.", labels, registry=reg
        )
        self.generation_tokens = Counter(
            "engine:generation_tokens", "Tokens generated.", labels, registry=reg
        )
        self.request_success = Counter(
            "engine:request_success", "Finished requests by finish reason.",
            labels + ["finish_reason"], registry=reg,
        )  # fmt: skip

        self.api_requests = Counter(
            "engine:api_requests", "HTTP API requests accepted, by route kind.",
            labels + ["kind"], registry=reg,
        )  # fmt: skip

        def hist(name: str, doc: str, buckets: tuple[float, ...] = _LATENCY_BUCKETS) -> Histogram:
            return Histogram(f"engine:{name}", doc, labels, buckets=buckets, registry=reg)

        self.ttft = hist("time_to_first_token_seconds", "Time to first token.")
        self.itl = hist("inter_token_latency_seconds", "Time between output tokens.", _ITL_BUCKETS)
        self.e2e = hist("e2e_request_latency_seconds", "Arrival to finish.")
        self.queue_time = hist("request_queue_time_seconds", "Arrival to first scheduled.")
        self.prefill_time = hist("request_prefill_time_seconds", "First scheduled to first token.")
        self.decode_time = hist("request_decode_time_seconds", "First token to last token.")
        reg.register(_SchedulerCollector(model_name, stats_fn))
        # Export every series from the start (at 0), so dashboards and rate() see them.
        for family in (self.prompt_tokens, self.generation_tokens, self.ttft, self.itl):
            family.labels(model_name)
        for family in (self.e2e, self.queue_time, self.prefill_time, self.decode_time):
            family.labels(model_name)
        for reason in ("stop", "length", "abort", "error"):
            self.request_success.labels(model_name, reason)
        for kind in API_REQUEST_KINDS:
            self.api_requests.labels(model_name, kind)

    def count_request(self, kind: str) -> None:
        """One accepted API request of ``kind`` (one of ``API_REQUEST_KINDS``)."""
        self.api_requests.labels(self.model_name, kind).inc()

    def render(self) -> bytes:
        return b"".join(generate_latest(r) for r in [self.registry, *self.extra_registries])

    def _add_tokens(self, num_prompt: int, num_generation: int) -> None:
        with self._lock:
            self.totals.num_prompt_tokens += num_prompt
            self.totals.num_generation_tokens += num_generation
        if num_prompt:
            self.prompt_tokens.labels(self.model_name).inc(num_prompt)
        if num_generation:
            self.generation_tokens.labels(self.model_name).inc(num_generation)

    def observe_iteration(self, it: Any) -> None:
        """Stats listener: one engine step's ``IterationStats``."""
        self._add_tokens(it.num_prompt_tokens, it.num_generation_tokens)
        m = self.model_name
        for value in it.time_to_first_tokens:
            self.ttft.labels(m).observe(value)
        for value in it.inter_token_latencies:
            self.itl.labels(m).observe(value)
        for fin in it.finished_requests:
            self.request_success.labels(m, fin.finish_reason).inc()
            self.e2e.labels(m).observe(fin.e2e_latency)
            for hist, value in (
                (self.queue_time, fin.queue_time),
                (self.prefill_time, fin.prefill_time),
                (self.decode_time, fin.decode_time),
            ):
                if value is not None:
                    hist.labels(m).observe(value)

    def request_tracker(self) -> RequestTracker:
        return RequestTracker(self)


class RequestTracker:
    """Server-side timing of one HTTP request, used when the engine reports no iterations."""

    def __init__(self, metrics: ServerMetrics) -> None:
        self.metrics = metrics
        self.arrival = time.monotonic()
        self.first_token: float | None = None
        self.last_token: float | None = None
        self.num_finished = 0

    def on_tokens(self, num_new_tokens: int) -> None:
        if num_new_tokens <= 0 or self.metrics.engine_reports_iterations:
            return
        now = time.monotonic()
        m = self.metrics.model_name
        if self.first_token is None:
            self.first_token = now
            self.metrics.ttft.labels(m).observe(now - self.arrival)
        elif self.last_token is not None:
            self.metrics.itl.labels(m).observe((now - self.last_token) / num_new_tokens)
        self.last_token = now

    def close(self, num_prompt: int) -> None:
        """The HTTP request ended; a request that never finished counts as aborted."""
        if self.num_finished == 0:
            self.on_finish("abort", num_prompt, 0)

    def on_finish(self, finish_reason: str, num_prompt: int, num_generation: int) -> None:
        self.num_finished += 1
        if self.metrics.engine_reports_iterations:
            return
        m = self.metrics.model_name
        now = time.monotonic()
        self.metrics._add_tokens(num_prompt, num_generation)
        self.metrics.request_success.labels(m, finish_reason).inc()
        self.metrics.e2e.labels(m).observe(now - self.arrival)
        if self.first_token is not None:
            self.metrics.prefill_time.labels(m).observe(self.first_token - self.arrival)
            self.metrics.decode_time.labels(m).observe((self.last_token or now) - self.first_token)
