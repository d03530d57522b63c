"""Readable server logs: a stats line every few seconds while busy, and warnings once.

``Engine stats: prompt 120.0 tok/s, generation 85.3 tok/s, running 4, waiting 0,
KV cache 12.5%, prefix cache hit rate 40.0%``.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import time
from collections.abc import Iterable

from engine.entrypoints.openai.metrics import ServerMetrics, StatsFn

logger = logging.getLogger("engine.server")


MAX_WARN_ONCE_MESSAGES = 1024
MAX_NAMED_FIELDS = 8
MAX_FIELD_NAME_CHARS = 64


class WarnOnce:
    """Log each distinct warning message once per server, remembering at most
    ``max_messages`` of them: once full, new messages are dropped (counted in
    ``num_dropped``) rather than logged, so hostile input can grow neither memory nor log."""

    def __init__(
        self, log: logging.Logger = logger, max_messages: int = MAX_WARN_ONCE_MESSAGES
    ) -> None:
        self.log = log
        self.max_messages = max_messages
        self.num_dropped = 0
        self._seen: set[str] = set()

    def __len__(self) -> int:
        return len(self._seen)

    def __call__(self, message: str) -> None:
        if message in self._seen:
            return
        if len(self._seen) >= self.max_messages:
            self.num_dropped += 1
            return
        self._seen.add(message)
        self.log.warning(message)


def ignored_fields_message(names: Iterable[str], num_names: int) -> str:
    """One line for a request's unknown fields: the first few names (each cut short) and
    how many more; built without sorting or copying all of them."""
    first = itertools.islice(names, MAX_NAMED_FIELDS)
    shown = [repr(name[:MAX_FIELD_NAME_CHARS]) for name in first]
    more = num_names - len(shown)
    listed = ", ".join(shown) + (f" and {more} more" if more > 0 else "")
    noun = "field" if num_names == 1 else "fields"
    return f"Request {noun} {listed} not supported by this server; ignored."


class StatsLogger:
    def __init__(self, metrics: ServerMetrics, stats_fn: StatsFn, interval_s: float) -> None:
        self.metrics = metrics
        self.stats_fn = stats_fn
        self.interval_s = interval_s
        self._last_time = time.monotonic()
        self._last_prompt = 0
        self._last_gen = 0
        self._last_queries = 0
        self._last_hits = 0

    def line(self) -> str | None:
        """The stats line for the interval since the last call; None when idle."""
        now = time.monotonic()
        elapsed = max(now - self._last_time, 1e-9)
        totals = self.metrics.totals
        num_prompt = totals.num_prompt_tokens - self._last_prompt
        num_gen = totals.num_generation_tokens - self._last_gen
        stats = self.stats_fn()
        queries = stats.prefix_cache_queries - self._last_queries
        hits = stats.prefix_cache_hits - self._last_hits
        self._last_time = now
        self._last_prompt = totals.num_prompt_tokens
        self._last_gen = totals.num_generation_tokens
        self._last_queries = stats.prefix_cache_queries
        self._last_hits = stats.prefix_cache_hits
        busy = num_prompt or num_gen or stats.num_running or stats.num_waiting
        if not busy:
            return None
        hit_rate = 100.0 * hits / queries if queries else 0.0
        return (
            f"Engine stats: prompt {num_prompt / elapsed:.1f} tok/s, "
            f"generation {num_gen / elapsed:.1f} tok/s, running {stats.num_running}, "
            f"waiting {stats.num_waiting}, KV cache {100.0 * stats.kv_cache_usage:.1f}%, "
            f"prefix cache hit rate {hit_rate:.1f}%"
        )

    async def run(self) -> None:
        while True:
            await asyncio.sleep(self.interval_s)
            try:
                line = self.line()
            except Exception:  # a dead engine: /health reports it, keep quiet here
                continue
            if line:
                logger.info(line)
