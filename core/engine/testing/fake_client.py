"""The one fake ``EngineClient``: the real HTTP stack over an engine whose output a test
controls. Both kinds of output are deterministic:

- **tokens** (``scripts`` unset): each step "generates" a token seeded by the prompt, the
  request seed and the sample index, at ``step_s`` seconds per token, with logprobs and
  stop strings; a prompt containing ``FAIL`` fails mid-stream;
- **scripts**: the text of ``scripts[seed or 0]`` in pieces of ``chunk_size`` characters,
  to check reasoning splits and parsed tool calls, which random weights never write.

Admission is real: ``max_running`` requests run, ``max_queued`` wait, more raise
``QueueFullError``; each running request holds ``ceil(tokens / block_size)`` KV blocks,
freed when it ends or is aborted. ``prepare`` is the engine's own front end
(``InputProcessor``: the real checks, limits and fan-out). ``last_prompt`` and
``last_params`` record the last request. Outputs follow the request's ``output_kind``
(cumulative, deltas or final only), with the ``delta_*`` fields set, as the engine's are.
"""

from __future__ import annotations

import asyncio
import math
import random
from collections.abc import AsyncGenerator, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from engine.engine_client import EngineLoad, load_of
from engine.errors import QueueFullError
from engine.lora.request import LoRARequest
from engine.model_executor.pooling_task import PoolingConfig
from engine.outputs import CompletionOutput, Logprobs, RequestOutput, SchedulerStats
from engine.outputs_processing.stats import EngineCounters
from engine.sampling_params import RequestOutputKind, SamplingParams
from engine.tokenization import apply_chat_template
from engine.tokenization.input_processor import InputProcessor, PreparedRequest, PromptType

__all__ = ["FakeEngineClient", "FakeEngineConfig"]


@dataclass
class FakeEngineConfig:
    max_model_len: int = 256
    num_blocks: int = 64
    block_size: int = 16
    max_running: int = 4
    max_queued: int = 8
    step_s: float = 0.02
    scripts: list[str] | None = None  # set: "generate" these texts (a request's seed picks)
    chunk_size: int = 3
    finish_reason: str = "stop"  # of a script
    sampling_defaults: dict[str, Any] = field(
        default_factory=lambda: {"temperature": 0.7, "top_p": 0.9}
    )


class FakeEngineClient:
    """An ``EngineClient`` (engine_client.py) with the behaviour described above."""

    def __init__(self, tokenizer: Any, config: FakeEngineConfig | None = None) -> None:
        self.tokenizer = tokenizer
        self.config = config if config is not None else FakeEngineConfig()
        self.max_model_len = self.config.max_model_len
        self.pooling: PoolingConfig | None = None
        self.is_ready = True
        self.dead_error: BaseException | None = None
        self.last_params: SamplingParams | None = None
        self.last_prompt: str | None = None
        self.last_lora_request: LoRARequest | None = None
        self._running: dict[str, int] = {}  # request id -> KV blocks held
        self._waiting = 0
        self._aborted: set[str] = set()
        self._slots = asyncio.Semaphore(self.config.max_running)
        self._counters = EngineCounters()
        self._front = InputProcessor(tokenizer, self.max_model_len, len(tokenizer), [])

    @classmethod
    def scripted(cls, tokenizer: Any, script: str, chunk_size: int = 3) -> FakeEngineClient:
        """A greedy-by-default client that answers every request with ``script``."""
        config = FakeEngineConfig(
            max_model_len=512, step_s=0.0, scripts=[script], chunk_size=chunk_size,
            max_running=64, max_queued=64, sampling_defaults={"temperature": 0.0},
        )  # fmt: skip
        return cls(tokenizer, config)

    @property
    def script(self) -> str:
        """The script of requests without a seed (the first)."""
        return (self.config.scripts or [""])[0]

    @script.setter
    def script(self, text: str) -> None:
        self.config.scripts = [text, *(self.config.scripts or [])[1:]]

    # -- the model and its tokenizer ----------------------------------------------------------

    def default_sampling_params(self) -> SamplingParams:
        return SamplingParams(**self.config.sampling_defaults, eos_token_ids=[])

    def apply_chat_template(
        self,
        messages: Sequence[Mapping[str, Any]],
        tools: Sequence[Mapping[str, Any]] | None = None,
        add_generation_prompt: bool = True,
        chat_template: str | None = None,
        chat_template_kwargs: Mapping[str, Any] | None = None,
    ) -> str:
        return apply_chat_template(  # the engine's own rendering (and its checks)
            self.tokenizer, messages, tools, add_generation_prompt, chat_template,
            chat_template_kwargs,
        )  # fmt: skip

    # -- admission, statistics, health --------------------------------------------------------

    def would_reject(self) -> str | None:
        return None  # generate() refuses exactly, with QueueFullError

    def stats(self) -> SchedulerStats:
        used = sum(self._running.values())
        return SchedulerStats(
            num_running=len(self._running),
            num_waiting=self._waiting,
            kv_cache_usage=used / self.config.num_blocks,
            num_preemptions=0,
            prefix_cache_queries=0,
            prefix_cache_hits=0,
            num_free_blocks=self.config.num_blocks - used,
            num_total_blocks=self.config.num_blocks,
        )

    def counters(self) -> EngineCounters:
        return self._counters

    def engine_loads(self) -> list[EngineLoad]:
        return [load_of(0, self)]

    def add_stats_listener(self, listener: Callable[[Any], None]) -> bool:
        return False  # no iteration stats: the HTTP layer counts tokens and latencies

    def stalled_for(self) -> float:
        return 0.0

    def silent_for(self) -> float:
        return 0.0

    def declare_dead(self, reason: str) -> None:
        self.dead_error = RuntimeError(reason)

    def shutdown(self, timeout: float = 10.0) -> None:
        self.is_ready = False

    # -- requests -----------------------------------------------------------------------------

    async def abort(self, request_id: str | Sequence[str]) -> None:
        self._aborted.update([request_id] if isinstance(request_id, str) else request_id)

    def prepare(
        self,
        request_id: str,
        prompts: Sequence[PromptType],
        params: SamplingParams | None = None,
        priority: int = 0,
        cache_salt: str | None = None,
        lora_request: LoRARequest | None = None,
    ) -> list[PreparedRequest]:
        """The engine's own front end (``InputProcessor``: its checks, limits, fan-out)."""
        params = params if params is not None else self.default_sampling_params()
        num = len(prompts)
        return self._front.prepare_all(
            request_id, prompts, [params] * num, priority, [cache_salt] * num,
            [lora_request] * num,
        )  # fmt: skip

    def generate_prepared(self, prepared: PreparedRequest) -> AsyncGenerator[RequestOutput, None]:
        return self._run(
            prepared.prompt_token_ids, prepared.params, prepared.request_id, prepared.lora_request
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
        params = params if params is not None else self.default_sampling_params()
        request_id = request_id if request_id is not None else f"fake-{id(params)}"
        ids = list(prompt) if isinstance(prompt, list) else self.tokenizer.encode(str(prompt))
        return self._run(ids, params, request_id, lora_request)

    async def _run(
        self,
        ids: list[int],
        params: SamplingParams,
        request_id: str,
        lora_request: LoRARequest | None,
    ) -> AsyncGenerator[RequestOutput, None]:
        self.last_lora_request = lora_request
        self.last_params, self.last_prompt = params, self.tokenizer.decode(ids)
        if self._waiting >= self.config.max_queued:
            raise QueueFullError(f"{self._waiting} requests are waiting (max_num_queued_reqs)")
        self._waiting += 1
        try:
            await self._slots.acquire()
        finally:
            self._waiting -= 1
        self._counters.num_requests_added += 1
        try:
            run = self._script if self.config.scripts is not None else self._tokens
            shape = _Shaper(params.output_kind)
            async for out in run(ids, params, request_id):
                shaped = shape(out)
                if shaped is not None:
                    yield shaped
        finally:
            self._running.pop(request_id, None)
            self._aborted.discard(request_id)
            self._slots.release()

    def _hold(self, request_id: str, n: int, num_tokens: int) -> None:
        self._running[request_id] = n * math.ceil(num_tokens / self.config.block_size)

    async def _script(
        self, ids: list[int], params: SamplingParams, request_id: str
    ) -> AsyncGenerator[RequestOutput, None]:
        scripts = self.config.scripts or [""]
        script = scripts[(params.seed or 0) % len(scripts)]
        size = self.config.chunk_size
        pieces = [script[i : i + size] for i in range(0, len(script), size)] or [""]
        text = ""
        for i, piece in enumerate(pieces):
            self._hold(request_id, params.n, len(ids) + i + 1)
            await asyncio.sleep(self.config.step_s)
            text += piece
            last = i == len(pieces) - 1
            aborted = request_id in self._aborted
            finish = "abort" if aborted else (self.config.finish_reason if last else None)
            outputs = [
                CompletionOutput(
                    index=j, text=text, token_ids=list(range(i + 1)), finish_reason=finish
                )
                for j in range(params.n)
            ]
            yield RequestOutput(request_id, None, ids, outputs, finish is not None)
            if finish is not None:
                return

    async def _tokens(
        self, ids: list[int], params: SamplingParams, request_id: str
    ) -> AsyncGenerator[RequestOutput, None]:
        n = params.n
        if params.seed is None and not params.greedy:
            rngs = [random.Random() for _ in range(n)]
        else:  # seeded or greedy: reproducible
            rngs = [random.Random(str((ids, params.seed, i))) for i in range(n)]
        outs = [CompletionOutput(index=i, text="", token_ids=[], logprobs=[]) for i in range(n)]
        fail = "FAIL" in self.tokenizer.decode(ids)
        assert params.max_tokens is not None
        for step in range(params.max_tokens):
            self._hold(request_id, n, len(ids) + step + 1)
            await asyncio.sleep(self.config.step_s)
            if fail and step == 2:
                yield RequestOutput(request_id, None, ids, outs, True, error="injected failure")
                return
            aborted = request_id in self._aborted
            for out, rng in zip(outs, rngs, strict=True):
                if out.finish_reason is None:
                    self._step(out, rng, params, aborted)
            done = all(o.finish_reason is not None for o in outs)
            yield RequestOutput(request_id, None, ids, [_copy(o) for o in outs], done)
            if done:
                return

    def _step(
        self, out: CompletionOutput, rng: random.Random, params: SamplingParams, aborted: bool
    ) -> None:
        if aborted:
            out.finish_reason = "abort"
            return
        token = rng.randrange(3, len(self.tokenizer))
        out.token_ids.append(token)
        k = params.logprobs or 0
        tops = [token] + [t for t in range(3, 3 + k) if t != token][: max(k - 1, 0)]
        values = [-0.5 - j for j in range(len(tops))]
        assert out.logprobs is not None
        out.logprobs.append(Logprobs(token, -0.5, 1, tops[:k], values[:k]))
        out.text = self.tokenizer.decode(out.token_ids)
        for stop in params.stop:
            if stop in out.text:
                out.text = out.text[: out.text.index(stop)]
                out.finish_reason, out.stop_reason = "stop", stop
        assert params.max_tokens is not None
        if out.finish_reason is None and len(out.token_ids) >= params.max_tokens:
            out.finish_reason = "length"


def _copy(out: CompletionOutput) -> CompletionOutput:
    return CompletionOutput(
        index=out.index,
        text=out.text,
        token_ids=list(out.token_ids),
        finish_reason=out.finish_reason,
        stop_reason=out.stop_reason,
        logprobs=list(out.logprobs or []),
    )


class _Shaper:
    """Cumulative outputs -> what ``output_kind`` asks for, with the ``delta_*`` fields."""

    def __init__(self, kind: RequestOutputKind) -> None:
        self.kind = kind
        self.sent: dict[int, tuple[int, int, int]] = {}  # index -> (chars, ids, logprobs)

    def __call__(self, out: RequestOutput) -> RequestOutput | None:
        if self.kind == RequestOutputKind.FINAL_ONLY and not out.finished:
            return None
        for c in out.outputs:
            chars, n_ids, n_lps = self.sent.get(c.index, (0, 0, 0))
            lps = c.logprobs or []
            c.delta_text, c.delta_token_ids = c.text[chars:], c.token_ids[n_ids:]
            c.delta_logprobs = lps[n_lps:] if c.logprobs is not None else None
            self.sent[c.index] = (len(c.text), len(c.token_ids), len(lps))
            if self.kind == RequestOutputKind.DELTA:
                c.text, c.token_ids, c.logprobs = c.delta_text, c.delta_token_ids, c.delta_logprobs
        return out
