"""The half of an engine client that does not depend on where the engine runs: the
per-request streams, the inbox of adds and aborts, admission, the stats snapshot and
what happens when the engine dies.

    caller (event loop)                         engine link (its own threads)
    generate() ── prepare (tokenize, validate)
               ── link.prepare (compile or not)
               ── inbox.put(Add) ───────────▶   take adds / aborts, claim_add
    async for out in stream  ◀── deliver(outputs): one wake-up per event loop per step
    generator closed early ── inbox.put(Abort) ─▶ abort the request

Both clients own one ``ClientStreams`` and one link: ``AsyncLLM`` a ``ThreadLink`` (the
engine on a thread of this process), ``ProcessAsyncLLM`` a ``ProcessLink`` (a pipe to the
engine process). The link reads the inbox, fills ``by_id`` and hands each step's outputs
to ``deliver``; this side never touches the engine.

A caller that falls behind gets the updates that queued up merged into one (outputs are
cumulative; the deltas are concatenated), so a busy event loop sends fewer, larger chunks.
Once the link's loop ends (``run_loop``), or the watchdog calls ``declare_dead``, every
open stream and queued add fails with ``EngineDeadError``.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import itertools
import logging
import queue
import threading
from collections.abc import AsyncGenerator, Callable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from engine.errors import EngineDeadError, EngineRequestError, RequestValidationError
from engine.llm_engine import LLMEngine
from engine.lora.request import LoRARequest
from engine.outputs import RequestOutput, SchedulerStats
from engine.outputs_processing import EngineCounters
from engine.sampling_params import SamplingParams
from engine.tokenization.input_processor import PreparedRequest, PromptType

logger = logging.getLogger(__name__)


@dataclass
class Stream:
    """Where one request's outputs go: its caller's event loop and queue."""

    loop: asyncio.AbstractEventLoop
    queue: asyncio.Queue[RequestOutput | BaseException]


@dataclass
class Add:
    prepared: PreparedRequest
    stream: Stream
    done: concurrent.futures.Future[None]


@dataclass
class Abort:
    request_ids: list[str]


STOP = object()  # in the inbox: the link stops its engine


class EngineLink(Protocol):
    """What ``generate`` needs from the link that carries its request to the engine."""

    def is_alive(self) -> bool: ...

    def check_alive(self) -> None:
        """Raise ``EngineDeadError`` when the engine cannot take requests."""
        ...

    async def prepare(self, prepared: PreparedRequest) -> None:
        """Work due before the add is queued (compiling the request's grammar)."""
        ...


class ClientStreams:
    """Per-request streams over an inbox that an engine link serves."""

    def __init__(
        self,
        front: LLMEngine,
        initial_stats: SchedulerStats,
        counters: EngineCounters,
        max_num_queued_reqs: int | None,
    ) -> None:
        self.front = front  # prepares requests (tokenize, validate); never steps
        self.inbox: queue.Queue[Any] = queue.Queue()
        self.by_id: dict[str, Stream] = {}  # the link's threads only
        self.dead_error: EngineDeadError | None = None
        self._stats_lock = threading.Lock()
        self._last_stats = initial_stats
        self._counters = counters
        self._max_num_queued_reqs = max_num_queued_reqs
        self._ids = itertools.count()

    # -- stats and admission (cheap, safe from any thread) ------------------------------------

    def stats(self) -> SchedulerStats:
        """Scheduler counters as of the last step (a snapshot; safe from any thread)."""
        with self._stats_lock:
            return self._last_stats

    def counters(self) -> EngineCounters:
        """Running totals as of the last step (a snapshot; safe from any thread)."""
        with self._stats_lock:
            return self._counters

    def set_stats(self, stats: SchedulerStats, counters: EngineCounters) -> None:
        with self._stats_lock:
            self._last_stats, self._counters = stats, counters

    def has_work(self) -> bool:
        """Requests in flight or commands queued."""
        return bool(self.by_id) or not self.inbox.empty()

    def would_reject(self) -> str | None:
        """Why a new request would meet a full waiting queue (``--max-num-queued-reqs``),
        from the last step's count plus adds not yet applied; None if it would fit.

        A pre-check for the server to refuse before tokenizing: the scheduler still enforces
        both bounds exactly when the request is added.
        """
        max_reqs = self._max_num_queued_reqs
        if max_reqs is None:
            return None
        with self._stats_lock:
            num_waiting = self._last_stats.num_waiting
        num_waiting += self.inbox.qsize()
        if num_waiting >= max_reqs:
            return (
                f"{num_waiting} requests are waiting, the bound set by --max-num-queued-reqs "
                f"({max_reqs})"
            )
        return None

    # -- requests (the caller's event loop) ---------------------------------------------------

    async def generate(
        self,
        link: EngineLink,
        prompt: PromptType | PreparedRequest,
        params: SamplingParams | None = None,
        request_id: str | None = None,
        priority: int = 0,
        cache_salt: str | None = None,
        lora_request: LoRARequest | None = None,
    ) -> AsyncGenerator[RequestOutput, None]:
        """Stream a request's outputs until it finishes; closing the iterator aborts it.

        ``prompt``: a prompt, prepared here (the front end) from the other arguments, or a
        ``PreparedRequest`` (from ``front.prepare_requests``), taken as it is.
        Bad input raises ``ValueError`` (``RequestValidationError``) on the first
        ``__anext__``; a full queue raises ``QueueFullError``.
        """
        if self.dead_error is not None:
            raise self.dead_error
        link.check_alive()
        if isinstance(prompt, PreparedRequest):
            prepared = prompt
        else:
            if request_id is None:
                request_id = f"req-{next(self._ids)}"
            prepared = self.front.prepare_request(
                request_id, prompt, params, priority, cache_salt, lora_request
            )
        request_id = prepared.request_id
        await link.prepare(prepared)
        loop = asyncio.get_running_loop()
        stream = Stream(loop, asyncio.Queue())
        done: concurrent.futures.Future[None] = concurrent.futures.Future()
        self.inbox.put(Add(prepared, stream, done))
        if not link.is_alive() and not done.done():
            fail_add(done, EngineDeadError("the engine stopped before the request began"))
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
            # Cancelled: the caller left before the link took the add, which it then skips
            # (see claim_add); an abort for an unknown id is ignored anyway.
            add_failed = done.done() and not done.cancelled() and done.exception() is not None
            if not finished and not add_failed:
                # Client went away (GeneratorExit / CancelledError): free the request.
                self.inbox.put(Abort([request_id]))

    def abort(self, request_id: str | Sequence[str]) -> None:
        """Abort requests; their generators yield a final output with finish_reason abort."""
        ids = [request_id] if isinstance(request_id, str) else list(request_id)
        self.inbox.put(Abort(ids))

    # -- the link's side ----------------------------------------------------------------------

    def claim_add(self, cmd: Add) -> bool:
        """Whether an add from the inbox should go ahead: False if its caller was cancelled
        while it waited, or (failing its future) if the request id is already running."""
        if not cmd.done.set_running_or_notify_cancel():
            return False
        request_id = cmd.prepared.request_id
        if request_id in self.by_id:
            cmd.done.set_exception(
                RequestValidationError(
                    f"request id {request_id!r} is already running; use a unique id"
                )
            )
            return False
        return True

    def deliver(self, outputs: list[RequestOutput]) -> None:
        """Hand a step's outputs to their callers: one wake-up per event loop per step
        (not one per request), so 256 streams cost the loop one callback, not 256."""
        batches: dict[asyncio.AbstractEventLoop, list[tuple[Stream, Any]]] = {}
        for out in outputs:
            stream = self.by_id.get(out.request_id)
            if stream is None:
                continue  # the caller stopped listening
            item: RequestOutput | BaseException = out
            if out.error is not None and out.finished:
                item = EngineRequestError(out.error)
            batches.setdefault(stream.loop, []).append((stream, item))
            if out.finished:
                del self.by_id[out.request_id]
        for loop, batch in batches.items():
            try:
                loop.call_soon_threadsafe(_put_batch, batch)
            except RuntimeError:
                pass  # the caller's event loop is closed

    def run_loop(self, loop: Callable[[], None]) -> None:
        """Run a link's loop (on the link's thread); however it ends, fail every stream
        and queued add still open. Only an exception marks the engine dead."""
        try:
            loop()
            error = EngineDeadError("the engine was shut down")
        except BaseException as exc:  # noqa: BLE001 - the loop must report every death
            logger.exception("the engine loop died")
            error = EngineDeadError(f"the engine loop died: {exc!r}")
            self.dead_error = error
        for stream in list(self.by_id.values()):
            _send(stream, error)
        self.by_id.clear()
        self._drain_inbox(error)

    def declare_dead(self, reason: str) -> EngineDeadError:
        """Fail every request in flight with ``EngineDeadError`` from outside the link's
        thread (the watchdog, when the engine is wedged and cannot do it itself)."""
        error = EngineDeadError(reason)
        self.dead_error = error
        for stream in list(self.by_id.values()):
            _send(stream, error)
        self._drain_inbox(error)  # adds the wedged link never took
        return error

    def _drain_inbox(self, error: EngineDeadError) -> None:
        while True:
            try:
                cmd = self.inbox.get_nowait()
            except queue.Empty:
                return
            if isinstance(cmd, Add):
                fail_add(cmd.done, error)


def fail_add(done: concurrent.futures.Future[None], error: BaseException) -> None:
    try:
        done.set_exception(error)
    except concurrent.futures.InvalidStateError:
        pass  # the link answered first


def _send(stream: Stream, item: RequestOutput | BaseException) -> None:
    put: Callable[[Any], None] = stream.queue.put_nowait
    try:
        stream.loop.call_soon_threadsafe(put, item)
    except RuntimeError:
        pass  # the caller's event loop is closed


def _put_batch(batch: list[tuple[Stream, Any]]) -> None:
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
