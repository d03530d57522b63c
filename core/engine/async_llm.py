"""The asynchronous engine client with the engine on a thread of this process
(``--no-engine-process``): ``AsyncLLM``, and ``ThreadLink``, the thread that steps it.

    caller (event loop)                      engine thread (ThreadLink)
    generate() ── prepare (tokenize, validate), compile the grammar
               ── inbox.put(add) ─────────▶  apply commands between steps
                                              step() ─▶ outputs
    async for out in stream ◀─ ClientStreams.deliver (one wake-up per step)
    generator closed early  ── inbox.put(abort) ─▶ abort: blocks freed at once

``AsyncLLM`` is the composition of a ``ClientStreams`` (streams, coalescing, admission,
stats snapshot, death; shared with ``ProcessAsyncLLM``) and a ``ThreadLink``; the model
facts (tokenizer, chat template, sampling defaults) come from the ``LLMEngine`` itself.

Only the engine thread touches the ``LLMEngine``'s requests; callers reach it through the
thread-safe inbox. A step that raises fails the requests in flight (their generators raise
``EngineRequestError``) and the loop goes on; if the loop itself dies, ``dead_error`` is
set and every pending and future call raises ``EngineDeadError``.
"""

from __future__ import annotations

import asyncio
import logging
import queue
import threading
import time
from collections.abc import AsyncGenerator, Mapping, Sequence
from typing import Any

from engine.client_streams import STOP, Abort, Add, ClientStreams
from engine.config import EngineArgs
from engine.engine_client import EngineLoad, load_of
from engine.errors import EngineDeadError
from engine.llm_engine import LLMEngine, StatsListener
from engine.lora.request import LoRARequest
from engine.model_executor.pooling_task import PoolingConfig
from engine.outputs import RequestOutput, SchedulerStats
from engine.outputs_processing import EngineCounters
from engine.sampling_params import SamplingParams
from engine.tokenization.input_processor import PreparedRequest, PromptType

logger = logging.getLogger(__name__)


class ThreadLink:
    """The engine thread: applies the inbox's adds and aborts between steps, steps the
    engine and delivers each step's outputs to the streams."""

    def __init__(self, engine: LLMEngine, streams: ClientStreams) -> None:
        self.engine, self.streams = engine, streams
        # Written by the engine thread each loop iteration; read by /health and the watchdog.
        self._heartbeat = time.monotonic()
        self._idle = False  # True while the engine thread blocks waiting for commands
        self._thread = threading.Thread(target=self._run, name="engine-loop", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def is_alive(self) -> bool:
        return self._thread.is_alive()

    def check_alive(self) -> None:
        if not self._thread.is_alive():
            raise EngineDeadError("the engine is not running (shut down or never started)")

    async def prepare(self, prepared: PreparedRequest) -> None:
        """Compile the request's constraint before queueing it: the engine runs in this
        process, so this is its one compile (in a worker process; awaited, so neither the
        event loop nor the engine thread waits). ``RequestValidationError`` for a bad one."""
        structured = prepared.params.structured_outputs
        if structured is not None:
            await asyncio.wrap_future(self.engine.compile_structured_outputs_async(structured))

    def stalled_for(self) -> float:
        """Seconds the loop has had work pending (requests in flight or commands queued)
        without finishing an iteration; 0 when idle or progressing."""
        if self._idle or not self.streams.has_work():
            return 0.0
        return max(0.0, time.monotonic() - self._heartbeat)

    def shutdown(self, timeout: float) -> None:
        if self._thread.is_alive():
            self.streams.inbox.put(STOP)
            self._thread.join(timeout)

    # -- engine thread ------------------------------------------------------------------------

    def _run(self) -> None:
        self.streams.run_loop(self._loop)

    def _loop(self) -> None:
        while True:
            self._heartbeat = time.monotonic()
            idle = not self.engine.has_unfinished_requests()
            if not self._apply_commands(block=idle):
                return
            if not self.engine.has_unfinished_requests():
                self._snapshot_stats()
                continue
            try:
                outputs = self.engine.step()
            except Exception as exc:
                logger.exception("engine step failed; failing the requests in flight")
                outputs = self.engine.fail_all_requests(f"engine step failed: {exc!r}")
            self.streams.deliver(outputs)
            self._snapshot_stats()

    def _apply_commands(self, block: bool) -> bool:
        """Apply queued adds and aborts; False once shutdown was asked for."""
        while True:
            self._idle = block
            try:
                cmd = self.streams.inbox.get(block=block)
            except queue.Empty:
                return True
            finally:
                self._heartbeat = time.monotonic()
                self._idle = False
            block = False
            if cmd is STOP:
                return False
            if isinstance(cmd, Add):
                self._apply_add(cmd)
            elif isinstance(cmd, Abort):
                self.streams.deliver(self.engine.abort_request(cmd.request_ids))
                for request_id in cmd.request_ids:
                    self.streams.by_id.pop(request_id, None)

    def _apply_add(self, cmd: Add) -> None:
        if not self.streams.claim_add(cmd):
            return
        try:
            self.engine.add_prepared_request(cmd.prepared)
        except Exception as exc:
            cmd.done.set_exception(exc)
            return
        self.streams.by_id[cmd.prepared.request_id] = cmd.stream
        cmd.done.set_result(None)

    def _snapshot_stats(self) -> None:
        self.streams.set_stats(self.engine.stats(), self.engine.counters())


class AsyncLLM:
    """``EngineClient`` over an engine on a thread of this process (see engine_client.py):
    a ``ClientStreams`` served by a ``ThreadLink``."""

    def __init__(
        self, engine: LLMEngine, start: bool = True, initial_stats: SchedulerStats | None = None
    ) -> None:
        self.engine = engine
        stats = initial_stats if initial_stats is not None else engine.stats()
        self._streams = ClientStreams(
            engine, stats, engine.counters(), _max_num_queued_reqs(engine)
        )
        self._link = ThreadLink(engine, self._streams)
        if start:
            self._link.start()

    @classmethod
    def from_args(cls, args: EngineArgs) -> AsyncLLM:
        return cls(LLMEngine.from_args(args))

    # -- what the API layer reads -------------------------------------------------------------

    @property
    def tokenizer(self) -> Any:
        return self.engine.tokenizer

    @property
    def max_model_len(self) -> int:
        return self.engine.max_model_len

    @property
    def pooling(self) -> PoolingConfig | None:
        """The ``PoolingConfig`` of an embedding model; ``None`` for a generating one."""
        pooling: PoolingConfig | None = self.engine.pooling
        return pooling

    def default_sampling_params(self) -> SamplingParams:
        return self.engine.default_sampling_params()

    def apply_chat_template(
        self,
        messages: Sequence[Mapping[str, Any]],
        tools: Sequence[Mapping[str, Any]] | None = None,
        add_generation_prompt: bool = True,
        chat_template: str | None = None,
        chat_template_kwargs: Mapping[str, Any] | None = None,
    ) -> str:
        return self.engine.apply_chat_template(
            messages, tools, add_generation_prompt, chat_template, chat_template_kwargs
        )

    # -- stats, liveness and admission (cheap, safe from any thread) --------------------------

    def stats(self) -> SchedulerStats:
        return self._streams.stats()

    def counters(self) -> EngineCounters:
        return self._streams.counters()

    def engine_loads(self) -> list[EngineLoad]:
        return [load_of(0, self)]

    def would_reject(self) -> str | None:
        return self._streams.would_reject()

    def add_stats_listener(self, listener: StatsListener) -> bool:
        """``listener(IterationStats)`` after each step, called from the engine thread.

        Register before serving: the list is read by the engine thread without a lock.
        """
        self.engine.add_stats_listener(listener)
        return True

    @property
    def is_ready(self) -> bool:
        return self._link.is_alive() and self._streams.dead_error is None

    @property
    def dead_error(self) -> EngineDeadError | None:
        return self._streams.dead_error

    def stalled_for(self) -> float:
        return self._link.stalled_for()

    def silent_for(self) -> float:
        """An engine thread in this process has no heartbeat to miss: ``stalled_for`` and
        the thread's liveness (``is_ready``) judge it."""
        return 0.0

    def declare_dead(self, reason: str) -> None:
        """Fail every request in flight (the watchdog, when the engine thread is wedged)."""
        self._streams.declare_dead(reason)

    # -- requests -----------------------------------------------------------------------------

    def prepare(
        self,
        request_id: str,
        prompts: Sequence[PromptType],
        params: SamplingParams | None = None,
        priority: int = 0,
        cache_salt: str | None = None,
        lora_request: LoRARequest | None = None,
    ) -> list[PreparedRequest]:
        """The front end: see ``LLMEngine.prepare_requests``."""
        return self.engine.prepare_requests(
            request_id, prompts, params, priority, cache_salt, lora_request
        )

    def generate_prepared(self, prepared: PreparedRequest) -> AsyncGenerator[RequestOutput, None]:
        """See ``ClientStreams.generate``: closing the iterator aborts the request."""
        return self._streams.generate(self._link, prepared)

    def generate(
        self,
        prompt: PromptType,
        params: SamplingParams | None = None,
        request_id: str | None = None,
        priority: int = 0,
        cache_salt: str | None = None,
        lora_request: LoRARequest | None = None,
    ) -> AsyncGenerator[RequestOutput, None]:
        """See ``ClientStreams.generate``: closing the iterator aborts the request."""
        return self._streams.generate(
            self._link, prompt, params, request_id, priority, cache_salt, lora_request
        )

    async def abort(self, request_id: str | Sequence[str]) -> None:
        self._streams.abort(request_id)

    def shutdown(self, timeout: float = 10.0) -> None:
        """Stop the engine thread (pending requests fail with ``EngineDeadError``)."""
        self._link.shutdown(timeout)


def _max_num_queued_reqs(engine: LLMEngine) -> int | None:
    scheduler = getattr(engine.engine_core, "scheduler", None)
    bound: int | None = getattr(getattr(scheduler, "config", None), "max_num_queued_reqs", None)
    return bound
