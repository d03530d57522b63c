"""A stand-in ``AsyncLLM`` with the real interface, for server tests that need control.

It "generates" deterministic tokens (seeded by the prompt, the request seed and the
sample index) at ``step_s`` seconds per token, holds ``ceil(tokens / block_size)`` KV blocks
per running request, frees them on finish or abort, bounds its queue (``QueueFullError``)
and can be told to fail a request mid-stream (prompt containing ``FAIL``). Used by
``fake_server.py``; the main suite runs the real engine.
"""

from __future__ import annotations

import asyncio
import math
import random
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

from engine.core.outputs import SchedulerStats
from engine.core.scheduler_output import Logprobs
from engine.errors import QueueFullError
from engine.outputs import CompletionOutput, RequestOutput
from engine.sampling_params import SamplingParams
from engine.tokenization import apply_chat_template


@dataclass
class FakeEngineConfig:
    max_model_len: int = 256
    num_blocks: int = 64
    block_size: int = 16
    max_running: int = 4
    max_queued: int = 8
    step_s: float = 0.02


class FakeAsyncLLM:
    def __init__(self, tokenizer: Any, config: FakeEngineConfig) -> None:
        self.tokenizer = tokenizer
        self.config = config
        self.max_model_len = config.max_model_len
        self.is_ready = True
        self.dead_error: BaseException | None = None
        self._running: dict[str, int] = {}  # req_id -> blocks held
        self._waiting = 0
        self._aborted: set[str] = set()
        self._slots = asyncio.Semaphore(config.max_running)
        self._num_preemptions = 0

    def default_sampling_params(self) -> SamplingParams:
        return SamplingParams(temperature=0.7, top_p=0.9, eos_token_ids=[])

    def apply_chat_template(
        self,
        messages: list[dict[str, Any]],
        tools: Any = None,
        add_generation_prompt: bool = True,
        chat_template: str | None = None,
        chat_template_kwargs: dict[str, Any] | None = None,
    ) -> str:
        return apply_chat_template(  # the engine's own rendering (and its checks)
            self.tokenizer, messages, tools, add_generation_prompt, chat_template,
            chat_template_kwargs,
        )  # fmt: skip

    def stats(self) -> SchedulerStats:
        used = sum(self._running.values())
        return SchedulerStats(
            num_running=len(self._running),
            num_waiting=self._waiting,
            kv_cache_usage=used / self.config.num_blocks,
            num_preemptions=self._num_preemptions,
            prefix_cache_queries=0,
            prefix_cache_hits=0,
            num_free_blocks=self.config.num_blocks - used,
            num_total_blocks=self.config.num_blocks,
        )

    async def abort(self, request_id: str) -> None:
        self._aborted.add(request_id)

    def shutdown(self) -> None:
        self.is_ready = False

    def _token(self, rng: random.Random) -> int:
        return rng.randrange(3, len(self.tokenizer))

    async def generate(
        self,
        prompt: str | list[int] | dict[str, Any],
        params: SamplingParams,
        request_id: str,
        priority: int = 0,
        cache_salt: str | None = None,
    ) -> AsyncIterator[RequestOutput]:
        ids = list(prompt) if isinstance(prompt, list) else self.tokenizer.encode(str(prompt))
        if self._waiting >= self.config.max_queued:
            raise QueueFullError(f"{self._waiting} requests are waiting (max_num_queued_reqs)")
        self._waiting += 1
        try:
            await self._slots.acquire()
        finally:
            self._waiting -= 1
        try:
            async for out in self._run(ids, params, request_id):
                yield out
        finally:
            self._running.pop(request_id, None)
            self._aborted.discard(request_id)
            self._slots.release()

    async def _run(
        self, ids: list[int], params: SamplingParams, request_id: str
    ) -> AsyncIterator[RequestOutput]:
        n = params.n
        if params.seed is None and not params.greedy:
            rngs = [random.Random() for _ in range(n)]
        else:  # seeded or greedy: reproducible
            rngs = [random.Random(str((ids, params.seed, i))) for i in range(n)]
        outs = [CompletionOutput(index=i, text="", token_ids=[], logprobs=[]) for i in range(n)]
        fail = "FAIL" in self.tokenizer.decode(ids)
        assert params.max_tokens is not None
        for step in range(params.max_tokens):
            self._running[request_id] = n * math.ceil(
                (len(ids) + step + 1) / self.config.block_size
            )
            await asyncio.sleep(self.config.step_s)
            if fail and step == 2:
                yield RequestOutput(request_id, None, ids, outs, True, error="injected failure")
                return
            aborted = request_id in self._aborted
            for out, rng in zip(outs, rngs, strict=True):
                if out.finish_reason is not None:
                    continue
                if aborted:
                    out.finish_reason = "abort"
                    continue
                token = self._token(rng)
                out.token_ids.append(token)
                k = params.logprobs or 0
                tops = [token] + [t for t in range(3, 3 + k) if t != token][: max(k - 1, 0)]
                values = [-0.5 - j for j in range(len(tops))]
                out.logprobs.append(Logprobs(token, -0.5, 1, tops[:k], values[:k]))
                out.text = self.tokenizer.decode(out.token_ids)
                for stop in params.stop:
                    if stop in out.text:
                        out.text = out.text[: out.text.index(stop)]
                        out.finish_reason, out.stop_reason = "stop", stop
                if out.finish_reason is None and len(out.token_ids) >= params.max_tokens:
                    out.finish_reason = "length"
            done = all(o.finish_reason is not None for o in outs)
            yield RequestOutput(request_id, None, ids, [_copy(o) for o in outs], done)
            if done:
                return


def _copy(out: CompletionOutput) -> CompletionOutput:
    return CompletionOutput(
        index=out.index,
        text=out.text,
        token_ids=list(out.token_ids),
        finish_reason=out.finish_reason,
        stop_reason=out.stop_reason,
        logprobs=list(out.logprobs or []),
    )
