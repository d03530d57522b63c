"""``--data-parallel-size N``: one engine client over N engine processes, one per GPU group.

    API server ── DataParallelAsyncLLM ─┬─ ProcessAsyncLLM ── pipe ── engine-core-0 (GPUs 0..t-1)
                  pick an engine per     └─ ProcessAsyncLLM ── pipe ── engine-core-1 (GPUs t..2t-1)
                  request, route aborts

Each request goes to one engine, chosen when it arrives:

- **prefix affinity**: a hash of the prompt's start (its first ``PREFIX_CHARS`` characters
  or ``PREFIX_TOKENS`` token ids, and the cache salt) names a preferred engine, so
  requests that share a system prompt or a conversation land where its KV blocks are
  cached;
- **load**: each engine's load is its queue and batch as of its last step (every API
  server's requests) or, if larger, this API server's requests in flight on it, plus its
  waiting queue again (a queued request is worse than a running one) and its KV cache use
  as a tie-break. The preferred engine wins unless it is more than ``AFFINITY_SLACK``
  requests busier than the least loaded engine, which then takes the request.

Everything that is not per request (tokenizer, chat template, sampling defaults, grammar
compilation) is engine 0's: all engines load the same model from the same arguments.
``stats()`` sums the engines (KV usage weighted by their block counts); ``engine_stats()``
gives each.
"""

from __future__ import annotations

import hashlib
import itertools
import struct
from collections.abc import AsyncGenerator, Callable, Mapping, Sequence
from dataclasses import replace
from typing import Any

from engine.engine_client import EngineClient, EngineLoad, load_of
from engine.lora.request import LoRARequest
from engine.model_executor.pooling_task import PoolingConfig
from engine.outputs import RequestOutput, SchedulerStats
from engine.outputs_processing.stats import EngineCounters
from engine.sampling_params import SamplingParams
from engine.tokenization.input_processor import PreparedRequest, PromptType

PREFIX_CHARS = 256  # about 64 tokens: four KV blocks of 16
PREFIX_TOKENS = 64
AFFINITY_SLACK = 4.0


def prefix_key(prompt: PromptType, cache_salt: str | None) -> int:
    """A stable hash of the prompt's start (and the salt): equal starts, equal keys."""
    if isinstance(prompt, Mapping):
        inner = prompt.get("prompt", prompt.get("prompt_token_ids", ""))
        return prefix_key(inner, cache_salt)
    if isinstance(prompt, str):
        data = prompt[:PREFIX_CHARS].encode("utf-8", "surrogatepass")
    else:
        ids = [int(t) for t in list(prompt)[:PREFIX_TOKENS]]
        data = struct.pack(f"<{len(ids)}q", *ids)
    digest = hashlib.blake2b(data + b"\x00" + (cache_salt or "").encode(), digest_size=8)
    return int.from_bytes(digest.digest(), "little")


def load_score(stats: SchedulerStats, num_in_flight: int) -> float:
    """How busy one engine is, in requests (lower is better)."""
    batch = max(stats.num_running + stats.num_waiting, num_in_flight)
    return batch + stats.num_waiting + stats.kv_cache_usage


def choose_engine(key: int, scores: Sequence[float], slack: float = AFFINITY_SLACK) -> int:
    """The preferred engine ``key % N`` unless it is over ``slack`` busier than the best."""
    preferred = key % len(scores)
    best = min(range(len(scores)), key=lambda i: (scores[i], i))
    return preferred if scores[preferred] <= scores[best] + slack else best


def sum_stats(all_stats: Sequence[SchedulerStats]) -> SchedulerStats:
    total_blocks = sum(s.num_total_blocks for s in all_stats)
    used = sum(s.kv_cache_usage * s.num_total_blocks for s in all_stats)
    return replace(
        all_stats[0],
        num_running=sum(s.num_running for s in all_stats),
        num_waiting=sum(s.num_waiting for s in all_stats),
        kv_cache_usage=used / total_blocks if total_blocks else 0.0,
        num_preemptions=sum(s.num_preemptions for s in all_stats),
        prefix_cache_queries=sum(s.prefix_cache_queries for s in all_stats),
        prefix_cache_hits=sum(s.prefix_cache_hits for s in all_stats),
        num_free_blocks=sum(s.num_free_blocks for s in all_stats),
        num_total_blocks=total_blocks,
        running_lora_adapters=tuple(
            sorted({n for s in all_stats for n in s.running_lora_adapters})
        ),
        waiting_lora_adapters=tuple(
            sorted({n for s in all_stats for n in s.waiting_lora_adapters})
        ),
    )


def device_groups(
    num_engines: int, tensor_parallel_size: int, device: str, visible: Sequence[str]
) -> list[dict[str, str]]:
    """The environment of each engine process: its own ``CUDA_VISIBLE_DEVICES`` slice of
    ``visible`` (GPU ids), ``tensor_parallel_size`` GPUs each; nothing on the CPU."""
    if device == "cpu":
        return [{} for _ in range(num_engines)]
    if device not in ("cuda", "auto"):
        raise ValueError(
            f"--data-parallel-size {num_engines} gives each engine its own GPUs; drop "
            f"--device {device} (choose GPUs with CUDA_VISIBLE_DEVICES instead)"
        )
    needed = num_engines * tensor_parallel_size
    if len(visible) < needed:
        raise ValueError(
            f"--data-parallel-size {num_engines} x --tensor-parallel-size "
            f"{tensor_parallel_size} needs {needed} GPUs; {len(visible)} are visible "
            f"({','.join(visible) or 'none'}): lower --data-parallel-size to "
            f"{max(1, len(visible) // tensor_parallel_size)}"
        )
    t = tensor_parallel_size
    return [
        {"CUDA_VISIBLE_DEVICES": ",".join(visible[i * t : (i + 1) * t])} for i in range(num_engines)
    ]


class DataParallelAsyncLLM:
    """``EngineClient`` over several engine clients, one request on one engine."""

    def __init__(self, engines: Sequence[EngineClient]) -> None:
        if len(engines) < 2:
            raise ValueError("DataParallelAsyncLLM needs at least two engines")
        self.engines = list(engines)
        self._num_in_flight = [0] * len(self.engines)
        self._owner: dict[str, int] = {}  # request id -> engine index, while it runs
        self._ids = itertools.count()

    # -- the model and its tokenizer: engine 0's (every engine serves the same model) ----------

    @property
    def tokenizer(self) -> Any:
        return self.engines[0].tokenizer

    @property
    def max_model_len(self) -> int:
        return self.engines[0].max_model_len

    @property
    def pooling(self) -> PoolingConfig | None:
        return self.engines[0].pooling

    def default_sampling_params(self) -> SamplingParams:
        return self.engines[0].default_sampling_params()

    def apply_chat_template(
        self,
        messages: Sequence[Mapping[str, Any]],
        tools: Sequence[Mapping[str, Any]] | None = None,
        add_generation_prompt: bool = True,
        chat_template: str | None = None,
        chat_template_kwargs: Mapping[str, Any] | None = None,
    ) -> str:
        return self.engines[0].apply_chat_template(
            messages, tools, add_generation_prompt, chat_template, chat_template_kwargs
        )

    # -- health and statistics ------------------------------------------------------------------

    @property
    def is_ready(self) -> bool:
        return all(bool(e.is_ready) for e in self.engines)

    @property
    def dead_error(self) -> BaseException | None:
        errors = [e.dead_error for e in self.engines if e.dead_error is not None]
        return errors[0] if errors else None

    def stalled_for(self) -> float:
        return max(float(e.stalled_for()) for e in self.engines)

    def silent_for(self) -> float:
        return max(float(e.silent_for()) for e in self.engines)

    def declare_dead(self, reason: str) -> None:
        for engine in self.engines:
            engine.declare_dead(reason)

    def engine_stats(self) -> list[SchedulerStats]:
        return [e.stats() for e in self.engines]

    def stats(self) -> SchedulerStats:
        return sum_stats(self.engine_stats())

    def counters(self) -> EngineCounters:
        total = EngineCounters()
        for engine in self.engines:
            c = engine.counters()
            total.num_prompt_tokens += c.num_prompt_tokens
            total.num_generation_tokens += c.num_generation_tokens
            total.num_preemptions += c.num_preemptions
            total.num_requests_added += c.num_requests_added
            for reason, count in c.finished_by_reason.items():
                total.finished_by_reason[reason] = total.finished_by_reason.get(reason, 0) + count
        return total

    def engine_loads(self) -> list[EngineLoad]:
        """Per engine, for ``/load``: its queue, batch, KV use and requests added."""
        return [load_of(index, engine) for index, engine in enumerate(self.engines)]

    def add_stats_listener(self, listener: Any) -> bool:
        return all([engine.add_stats_listener(listener) for engine in self.engines])

    def would_reject(self) -> str | None:
        """A reason only when every engine's queue is full."""
        reasons = [e.would_reject() for e in self.engines]
        return None if any(r is None for r in reasons) else reasons[0]

    # -- requests ---------------------------------------------------------------------------------

    def choose(self, prompt: PromptType, cache_salt: str | None) -> int:
        open_engines = [i for i, e in enumerate(self.engines) if e.would_reject() is None]
        candidates = open_engines or list(range(len(self.engines)))
        scores = [load_score(self.engines[i].stats(), self._num_in_flight[i]) for i in candidates]
        return candidates[choose_engine(prefix_key(prompt, cache_salt), scores)]

    def prepare(
        self,
        request_id: str,
        prompts: Sequence[PromptType],
        params: SamplingParams | None = None,
        priority: int = 0,
        cache_salt: str | None = None,
        lora_request: LoRARequest | None = None,
    ) -> list[PreparedRequest]:
        """Engine 0's front end (every engine serves the same model)."""
        return self.engines[0].prepare(
            request_id, prompts, params, priority, cache_salt, lora_request
        )

    def generate_prepared(self, prepared: PreparedRequest) -> AsyncGenerator[RequestOutput, None]:
        return self._run(
            prepared.request_id,
            prepared.prompt_token_ids,
            prepared.cache_salt,
            prepared.lora_request,
            lambda engine: engine.generate_prepared(prepared),
        )

    def generate(
        self,
        prompt: PromptType,
        params: SamplingParams | None = None,
        request_id: str | None = None,
        priority: int = 0,
        cache_salt: str | None = None,
        lora_request: LoRARequest | None = None,
    ) -> AsyncGenerator[RequestOutput, None]:
        rid = request_id if request_id is not None else f"dp-{next(self._ids)}"

        def start(engine: EngineClient) -> AsyncGenerator[RequestOutput, None]:
            return engine.generate(prompt, params, rid, priority, cache_salt, lora_request)

        return self._run(rid, prompt, cache_salt, lora_request, start)

    async def _run(
        self,
        request_id: str,
        prompt: PromptType,
        cache_salt: str | None,
        lora_request: LoRARequest | None,
        start: Callable[[EngineClient], AsyncGenerator[RequestOutput, None]],
    ) -> AsyncGenerator[RequestOutput, None]:
        """The request's outputs from the engine ``choose`` picks for it."""
        # An adapter's requests share prefixes only with each other: route by both.
        route_key = cache_salt
        if lora_request is not None:
            route_key = f"{cache_salt or ''}\x00lora:{lora_request.cache_key}"
        index = self.choose(prompt, route_key)
        self._owner[request_id] = index
        self._num_in_flight[index] += 1
        stream = start(self.engines[index])
        try:
            async for output in stream:
                yield output
        finally:
            await stream.aclose()  # an early exit aborts the request on its engine
            self._num_in_flight[index] -= 1
            if self._owner.get(request_id) == index:
                del self._owner[request_id]

    async def abort(self, request_id: str | Sequence[str]) -> None:
        ids = [request_id] if isinstance(request_id, str) else list(request_id)
        for rid in ids:
            index = self._owner.get(rid)
            targets = self.engines if index is None else [self.engines[index]]
            for engine in targets:
                await engine.abort(rid)

    def shutdown(self, timeout: float = 10.0) -> None:
        for engine in self.engines:
            engine.shutdown(timeout)


__all__ = [
    "AFFINITY_SLACK",
    "DataParallelAsyncLLM",
    "choose_engine",
    "device_groups",
    "load_score",
    "prefix_key",
    "sum_stats",
]
