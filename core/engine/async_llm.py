"""The asynchronous engine client: one background thread steps the engine; asyncio callers
stream ``RequestOutput`` records per request.

    caller (event loop)                      engine thread
    generate() ── prepare (tokenize, validate)
               ── inbox.put(add) ─────────▶  apply commands between steps
                                              step() ─▶ outputs
    async for out in queue  ◀─ call_soon_threadsafe(put a step's outputs)  (one per step)
    generator closed early  ── inbox.put(abort) ─▶ abort: blocks freed at once

A caller that falls behind gets the updates that queued up merged into one (outputs are
cumulative; the deltas are concatenated), so a busy event loop sends fewer, larger chunks.

Only the engine thread touches the ``LLMEngine``; callers reach it through the thread-safe
inbox. A step that raises fails the requests in flight (their generators raise
``EngineRequestError``) and the loop goes on; if the loop itself dies, ``dead_error`` is
set and every pending and future call raises ``EngineDeadError``.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import itertools
import logging
import queue
import threading
import time
from collections.abc import AsyncGenerator, Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from engine.config import EngineArgs
from engine.engine_client import EngineLoad, load_of
from engine.errors import (
    EngineDeadError,
    EngineRequestError,
    RequestValidationError,
)
from engine.llm_engine import LLMEngine, StatsListener
from engine.lora.request import LoRARequest
from engine.model_executor.pooling_task import PoolingConfig
from engine.outputs import RequestOutput, SchedulerStats
from engine.outputs_processing import EngineCounters
from engine.sampling_params import SamplingParams, StructuredOutputsParams
from engine.tokenization.input_processor import PreparedRequest, PromptType

logger = logging.getLogger(__name__)


@dataclass
class _Stream:
    loop: asyncio.AbstractEventLoop
    queue: asyncio.Queue[RequestOutput | BaseException]


@dataclass
class _Add:
    prepared: PreparedRequest
    stream: _Stream
    done: concurrent.futures.Future[None]


@dataclass
class _Abort:
    request_ids: list[str]


_STOP = object()


class AsyncLLM:
    """``EngineClient`` over an engine on a thread of this process (see engine_client.py).

    Also the base of the process client, which replaces the thread's engine loop with a
    pipe to the engine process and keeps the rest (streams, coalescing, admission)."""

    def __init__(
        self, engine: LLMEngine, start: bool = True, initial_stats: SchedulerStats | None = None
    ) -> None:
        self.engine = engine
        self._inbox: queue.Queue[Any] = queue.Queue()
        self._streams: dict[str, _Stream] = {}  # engine thread only
        self._stats_lock = threading.Lock()
        self._last_stats = initial_stats if initial_stats is not None else engine.stats()
        self._counters = engine.counters()
        self.dead_error: EngineDeadError | None = None
        self._ids = itertools.count()
        # Written by the engine thread each loop iteration; read by /health and the watchdog.
        self._heartbeat = time.monotonic()
        self._idle = False  # True while the engine thread blocks waiting for commands
        self._thread = threading.Thread(target=self._run, name="engine-loop", daemon=True)
        if start:
            self._thread.start()

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
    def model_name(self) -> str:
        return self.engine.model_name

    @property
    def pooling(self) -> PoolingConfig | None:
        """The ``PoolingConfig`` of an embedding model; ``None`` for a generating one."""
        pooling: PoolingConfig | None = self.engine.pooling
        return pooling

    @property
    def is_ready(self) -> bool:
        return self._thread.is_alive() and self.dead_error is None

    @property
    def reasoning_parser_cls(self) -> Any:
        """The ``--reasoning-parser`` class, or ``None``."""
        return self.engine.reasoning_parser_cls

    def validate_structured_outputs(self, params: StructuredOutputsParams) -> None:
        """Cheap checks of a constraint (never compiles): ``RequestValidationError``."""
        self.engine.validate_structured_outputs(params)

    def default_sampling_params(self) -> SamplingParams:
        return self.engine.default_sampling_params()

    def sampling_params_from_request(self, request_fields: Mapping[str, Any]) -> SamplingParams:
        return self.engine.sampling_params_from_request(request_fields)

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

    def stats(self) -> SchedulerStats:
        """Scheduler counters as of the last step (a snapshot; safe from any thread)."""
        with self._stats_lock:
            return self._last_stats

    def counters(self) -> EngineCounters:
        """Running totals as of the last step (a snapshot; safe from any thread)."""
        with self._stats_lock:
            return self._counters

    # -- liveness and admission (cheap, safe from any thread) ---------------------------------

    def stalled_for(self) -> float:
        """Seconds the loop has had work pending (requests in flight or commands queued)
        without finishing an iteration; 0 when idle or progressing."""
        if self._idle or (not self._streams and self._inbox.empty()):
            return 0.0
        return max(0.0, time.monotonic() - self._heartbeat)

    def would_reject(self) -> str | None:
        """Why a new request would meet a full waiting queue (``--max-num-queued-reqs``),
        from the last step's count plus adds not yet applied; None if it would fit.

        A pre-check for the server to refuse before tokenizing: the scheduler still enforces
        both bounds exactly when the request is added.
        """
        max_reqs = self._max_num_queued_reqs()
        if max_reqs is None:
            return None
        with self._stats_lock:
            num_waiting = self._last_stats.num_waiting
        num_waiting += self._inbox.qsize()
        if num_waiting >= max_reqs:
            return (
                f"{num_waiting} requests are waiting, the bound set by --max-num-queued-reqs "
                f"({max_reqs})"
            )
        return None

    def _max_num_queued_reqs(self) -> int | None:
        scheduler = getattr(self.engine.engine_core, "scheduler", None)
        bound: int | None = getattr(getattr(scheduler, "config", None), "max_num_queued_reqs", None)
        return bound

    def silent_for(self) -> float:
        """An engine thread in this process has no heartbeat to miss: ``stalled_for`` and
        the thread's liveness (``is_ready``) judge it."""
        return 0.0

    def engine_loads(self) -> list[EngineLoad]:
        return [load_of(0, self)]

    def declare_dead(self, reason: str) -> None:
        """Fail every request in flight with ``EngineDeadError`` from outside the engine
        thread (the watchdog, when that thread is wedged and cannot do it itself)."""
        error = EngineDeadError(reason)
        self.dead_error = error
        for stream in list(self._streams.values()):
            self._send(stream, error)
        self._drain_inbox_after_death(error)  # adds the wedged thread never took

    def add_stats_listener(self, listener: StatsListener) -> bool:
        """``listener(IterationStats)`` after each step, called from the engine thread.

        Register before serving: the list is read by the engine thread without a lock.
        """
        self.engine.add_stats_listener(listener)
        return True

    # -- requests -----------------------------------------------------------------------------

    async def generate(
        self,
        prompt: PromptType,
        params: SamplingParams | None = None,
        request_id: str | None = None,
        priority: int = 0,
        cache_salt: str | None = None,
        lora_request: LoRARequest | None = None,
    ) -> AsyncGenerator[RequestOutput, None]:
        """Stream a request's outputs until it finishes; closing the iterator aborts it.

        Bad input raises ``ValueError`` (``RequestValidationError``) on the first
        ``__anext__``; a full queue raises ``QueueFullError``.
        """
        self._check_alive()
        if request_id is None:
            request_id = f"req-{next(self._ids)}"
        prepared = self.engine.prepare_request(
            request_id, prompt, params, priority, cache_salt, lora_request
        )
        await self._compile_constraint(prepared)
        loop = asyncio.get_running_loop()
        stream = _Stream(loop, asyncio.Queue())
        done: concurrent.futures.Future[None] = concurrent.futures.Future()
        self._inbox.put(_Add(prepared, stream, done))
        if not self._thread.is_alive() and not done.done():
            self._fail_add(done, EngineDeadError("the engine stopped before the request began"))
        finished = False
        try:
            await asyncio.wrap_future(done)
            while True:
                item = await stream.queue.get()
                if isinstance(item, BaseException):
                    finished = True
                    raise item
                if not item.finished and not stream.queue.empty():
                    item = _coalesce(item, stream.queue)
                    if isinstance(item, BaseException):
                        finished = True
                        raise item
                finished = item.finished
                yield item
                if finished:
                    return
        finally:
            # Cancelled: the caller left before the engine thread took the add, which it
            # then skips (see _apply_add); an abort for an unknown id is ignored anyway.
            add_failed = done.done() and not done.cancelled() and done.exception() is not None
            if not finished and not add_failed:
                # Client went away (GeneratorExit / CancelledError): free the request.
                self._inbox.put(_Abort([request_id]))

    async def _compile_constraint(self, prepared: PreparedRequest) -> None:
        """Compile the request's constraint before queueing it: the engine runs in this
        process, so this is its one compile (in a worker process; awaited, so neither the
        event loop nor the engine thread waits). ``RequestValidationError`` for a bad one."""
        structured = prepared.params.structured_outputs
        if structured is not None:
            await asyncio.wrap_future(self.engine.compile_structured_outputs_async(structured))

    async def abort(self, request_id: str | Sequence[str]) -> None:
        """Abort requests; their generators yield a final output with finish_reason abort."""
        ids = [request_id] if isinstance(request_id, str) else list(request_id)
        self._inbox.put(_Abort(ids))

    def shutdown(self, timeout: float = 10.0) -> None:
        """Stop the engine thread (pending requests fail with ``EngineDeadError``)."""
        if self._thread.is_alive():
            self._inbox.put(_STOP)
            self._thread.join(timeout)

    def _check_alive(self) -> None:
        if self.dead_error is not None:
            raise self.dead_error
        if not self._thread.is_alive():
            raise EngineDeadError("the engine is not running (shut down or never started)")

    # -- engine thread ------------------------------------------------------------------------

    def _run(self) -> None:
        try:
            self._loop()
            error = EngineDeadError("the engine was shut down")
        except BaseException as exc:  # noqa: BLE001 - the loop must report every death
            logger.exception("the engine loop died")
            error = EngineDeadError(f"the engine loop died: {exc!r}")
            self.dead_error = error
        for stream in list(self._streams.values()):
            self._send(stream, error)
        self._streams.clear()
        self._drain_inbox_after_death(error)

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
            self._deliver(outputs)
            self._snapshot_stats()

    def _apply_commands(self, block: bool) -> bool:
        """Apply queued adds and aborts; False once shutdown was asked for."""
        while True:
            self._idle = block
            try:
                cmd = self._inbox.get(block=block)
            except queue.Empty:
                return True
            finally:
                self._heartbeat = time.monotonic()
                self._idle = False
            block = False
            if cmd is _STOP:
                return False
            if isinstance(cmd, _Add):
                self._apply_add(cmd)
            elif isinstance(cmd, _Abort):
                self._deliver(self.engine.abort_request(cmd.request_ids))
                for request_id in cmd.request_ids:
                    self._streams.pop(request_id, None)

    def _claim_add(self, cmd: _Add) -> bool:
        """Whether an add from the inbox should go ahead: False if its caller was cancelled
        while it waited, or (failing its future) if the request id is already running."""
        if not cmd.done.set_running_or_notify_cancel():
            return False
        request_id = cmd.prepared.request_id
        if request_id in self._streams:
            cmd.done.set_exception(
                RequestValidationError(
                    f"request id {request_id!r} is already running; use a unique id"
                )
            )
            return False
        return True

    def _apply_add(self, cmd: _Add) -> None:
        if not self._claim_add(cmd):
            return
        request_id = cmd.prepared.request_id
        try:
            self.engine.add_prepared_request(cmd.prepared)
        except Exception as exc:
            cmd.done.set_exception(exc)
            return
        self._streams[request_id] = cmd.stream
        cmd.done.set_result(None)

    def _deliver(self, outputs: list[RequestOutput]) -> None:
        """Hand a step's outputs to their callers: one wake-up per event loop per step
        (not one per request), so 256 streams cost the loop one callback, not 256."""
        batches: dict[asyncio.AbstractEventLoop, list[tuple[_Stream, Any]]] = {}
        for out in outputs:
            stream = self._streams.get(out.request_id)
            if stream is None:
                continue  # the caller stopped listening
            item: RequestOutput | BaseException = out
            if out.error is not None and out.finished:
                item = EngineRequestError(out.error)
            batches.setdefault(stream.loop, []).append((stream, item))
            if out.finished:
                del self._streams[out.request_id]
        for loop, batch in batches.items():
            try:
                loop.call_soon_threadsafe(_put_batch, batch)
            except RuntimeError:
                pass  # the caller's event loop is closed

    def _send(self, stream: _Stream, item: RequestOutput | BaseException) -> None:
        put: Callable[[Any], None] = stream.queue.put_nowait
        try:
            stream.loop.call_soon_threadsafe(put, item)
        except RuntimeError:
            pass  # the caller's event loop is closed

    def _snapshot_stats(self) -> None:
        stats, counters = self.engine.stats(), self.engine.counters()
        with self._stats_lock:
            self._last_stats, self._counters = stats, counters

    def _drain_inbox_after_death(self, error: EngineDeadError) -> None:
        while True:
            try:
                cmd = self._inbox.get_nowait()
            except queue.Empty:
                return
            if isinstance(cmd, _Add):
                self._fail_add(cmd.done, error)

    @staticmethod
    def _fail_add(done: concurrent.futures.Future[None], error: BaseException) -> None:
        try:
            done.set_exception(error)
        except concurrent.futures.InvalidStateError:
            pass  # the engine thread answered first


def _put_batch(batch: list[tuple[_Stream, Any]]) -> None:
    for stream, item in batch:
        stream.queue.put_nowait(item)


def _coalesce(
    first: RequestOutput, pending: asyncio.Queue[RequestOutput | BaseException]
) -> RequestOutput | BaseException:
    """Merge the updates that queued up behind ``first`` while the caller was busy into
    one: the newest (outputs are cumulative) with the skipped updates' deltas prepended.

    A caller slower than the engine (256 SSE streams on one event loop) then sends one
    chunk per catch-up instead of one per step, so it falls behind by less each time.
    Stops at a finished update or an error, which are delivered as they are.
    """
    merged = first
    while not merged.finished and not pending.empty():
        item = pending.get_nowait()
        if isinstance(item, BaseException):
            return item  # an engine failure ends the stream; the text so far is moot
        _prepend_deltas(item, merged)
        merged = item
    return merged


def _prepend_deltas(later: RequestOutput, earlier: RequestOutput) -> None:
    before = {c.index: c for c in earlier.outputs}
    for c in later.outputs:
        prev = before.get(c.index)
        if prev is None:
            continue
        c.delta_text = prev.delta_text + c.delta_text
        c.delta_token_ids = prev.delta_token_ids + c.delta_token_ids
        if prev.delta_logprobs is not None or c.delta_logprobs is not None:
            c.delta_logprobs = (prev.delta_logprobs or []) + (c.delta_logprobs or [])
