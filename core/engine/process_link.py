"""The pipe between an engine client and the engine process: the messages that cross it
and ``ProcessLink``, the client's end (``ProcessAsyncLLM``'s link).

    ClientStreams.inbox ─▶ sender thread ── ("add", prepared) / ("abort", ids) / ("stop",) ─▶
    ClientStreams.deliver ◀─ receiver thread ◀── ("added", id, error) / ("step", ...) ──

The engine process sends only deltas; the receiver rebuilds cumulative outputs for the
requests that asked for them (``CUMULATIVE``, ``FINAL_ONLY``).
"""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass, field
from typing import Any

from engine.client_streams import STOP, Abort, Add, ClientStreams, fail_add
from engine.errors import EngineDeadError, from_wire
from engine.outputs import CompletionOutput, RequestOutput, SchedulerStats
from engine.outputs_processing import EngineCounters, IterationStats
from engine.sampling_params import RequestOutputKind
from engine.tokenization.input_processor import PreparedRequest

logger = logging.getLogger(__name__)

HEARTBEAT_S = 1.0  # an idle engine process sends a step message at least this often

# -- what crosses the pipe ------------------------------------------------------------------
# Per step: ("step", updates, scheduler stats, counters, iteration stats). Each update is a
# plain tuple (unpickling 256 tuples takes a tenth of the time 256 dataclasses take):
#   (request_id, finished, error, num_cached_tokens, prompt_logprobs or None, deltas)
# with deltas = ((index, delta_text, delta_token_ids, delta_logprobs, finish_reason,
# stop_reason), ...); prompt logprobs travel once, with a request's first update.

Update = tuple[
    str, bool, "str | None", int, "list[Any] | None", tuple[tuple[Any, ...], ...],
    "list[float] | None",
]  # fmt: skip


def to_update(out: RequestOutput, send_prompt_logprobs: bool) -> Update:
    deltas = tuple(
        (c.index, c.delta_text, c.delta_token_ids, c.delta_logprobs, c.finish_reason,
         c.stop_reason)
        for c in out.outputs
    )  # fmt: skip
    prompt_logprobs = out.prompt_logprobs if send_prompt_logprobs else None
    return (out.request_id, out.finished, out.error, out.num_cached_tokens, prompt_logprobs,
            deltas, out.pooled)  # fmt: skip


@dataclass
class _ClientRequest:
    """What the client has of a request: its output kind, and what rebuilding cumulative
    outputs needs (``CUMULATIVE`` and ``FINAL_ONLY`` requests only)."""

    prompt: str | None
    prompt_token_ids: list[int]
    kind: RequestOutputKind
    texts: dict[int, str] = field(default_factory=dict)
    token_ids: dict[int, list[int]] = field(default_factory=dict)
    logprobs: dict[int, list[Any] | None] = field(default_factory=dict)
    prompt_logprobs: list[Any] | None = None


class ProcessLink:
    """A sender thread (inbox -> pipe) and a receiver thread (pipe -> streams) over one
    connection to the engine process. ``proc`` None: the process is shared and its
    supervisor's to stop (``--api-server-count`` > 1)."""

    def __init__(self, conn: Any, proc: Any, streams: ClientStreams) -> None:
        self._conn, self._proc, self.streams = conn, proc, streams
        self._listeners: list[Any] = []
        self._requests: dict[str, _ClientRequest] = {}
        self._pending_adds: dict[str, Any] = {}
        self._stopping = False  # set by the sender once it asked the engine to stop
        self._last_message = time.monotonic()
        self._receiver = threading.Thread(target=self._run, name="engine-receiver", daemon=True)
        self._sender = threading.Thread(target=self._send_loop, name="engine-sender", daemon=True)

    def start(self) -> None:
        self._sender.start()
        self._receiver.start()

    def is_alive(self) -> bool:
        return self._receiver.is_alive()

    def check_alive(self) -> None:
        if not self._receiver.is_alive():
            raise EngineDeadError("the engine is not running (shut down or never started)")
        if self._proc is not None and not self._proc.is_alive():
            raise EngineDeadError("the engine process is not running")

    async def prepare(self, prepared: PreparedRequest) -> None:
        """Nothing here: this process only validated the constraint (``prepare_request``);
        the engine process compiles it once, off its loop, before queueing the request."""

    def add_stats_listener(self, listener: Any) -> None:
        self._listeners.append(listener)

    def stalled_for(self) -> float:
        if not self.streams.has_work():
            return 0.0
        return max(0.0, time.monotonic() - self._last_message - HEARTBEAT_S)

    def silent_for(self) -> float:
        """Seconds the idle engine process has sent nothing beyond its heartbeat period (it
        reports at least once a second when idle); 0 while requests are in flight, where
        a long step is normal and ``stalled_for`` judges instead."""
        if self.streams.has_work():
            return 0.0
        return max(0.0, time.monotonic() - self._last_message - HEARTBEAT_S)

    def declare_dead(self, error: EngineDeadError) -> None:
        """After the streams failed: fail the adds the engine never answered, kill it."""
        self._fail_pending_adds(error)
        self._kill()

    def shutdown(self, timeout: float) -> None:
        if self._receiver.is_alive():
            self.streams.inbox.put(STOP)
            self._receiver.join(timeout)
        if self._proc is not None:
            self._proc.join(timeout)
        self._kill()

    def _kill(self) -> None:
        if self._proc is not None:  # a shared engine process is the supervisor's to stop
            kill_engine_process(self._proc)

    def _exitcode(self) -> int | None:
        return None if self._proc is None else self._proc.exitcode

    def _fail_pending_adds(self, error: EngineDeadError) -> None:
        """Adds forwarded to the engine process and never answered (it died or is wedged):
        their callers still wait for the answer, so give them the error."""
        for request_id in list(self._pending_adds):
            done = self._pending_adds.pop(request_id, None)
            if done is not None:
                fail_add(done, error)

    # -- sender thread: inbox -> pipe ---------------------------------------------------------

    def _send_loop(self) -> None:
        while True:
            cmd = self.streams.inbox.get()
            try:
                if cmd is STOP:
                    self._stopping = True
                    self._conn.send(("stop",))
                    return
                if isinstance(cmd, Add):
                    self._forward_add(cmd)
                elif isinstance(cmd, Abort):
                    # Streams stay until the engine's final (abort) output reaches them.
                    self._conn.send(("abort", cmd.request_ids))
            except (OSError, EOFError):
                return  # the engine process is gone; the receiver reports it

    def _forward_add(self, cmd: Add) -> None:
        if not self.streams.claim_add(cmd):
            return
        prepared = cmd.prepared
        request_id = prepared.request_id
        self.streams.by_id[request_id] = cmd.stream
        self._requests[request_id] = _ClientRequest(
            prepared.prompt, prepared.prompt_token_ids, prepared.params.output_kind
        )
        self._pending_adds[request_id] = cmd.done
        self._conn.send(("add", prepared))

    # -- receiver thread: pipe -> streams -----------------------------------------------------

    def _run(self) -> None:
        self.streams.run_loop(self._loop)  # fails the streams and the adds still queued
        error = self.streams.dead_error or EngineDeadError("the engine process stopped")
        self._fail_pending_adds(error)

    def _loop(self) -> None:
        while True:
            try:
                msg = self._conn.recv()
            except (EOFError, OSError):
                if not self._stopping or self._exitcode() not in (0, None):
                    code = self._exitcode()
                    raise EngineDeadError(
                        "the engine process exited"
                        + ("" if code is None else f" (exit code {code})")
                    ) from None
                return  # a requested shutdown
            self._last_message = time.monotonic()
            if msg[0] == "step":
                self._on_step(msg[1], msg[2], msg[3], msg[4])
            elif msg[0] == "added":
                self._on_added(msg[1], msg[2])

    def _on_added(self, request_id: str, error: tuple[str, str] | None) -> None:
        done = self._pending_adds.pop(request_id, None)
        if done is None:
            return
        if error is None:
            done.set_result(None)
            return
        self.streams.by_id.pop(request_id, None)
        self._requests.pop(request_id, None)
        done.set_exception(from_wire(*error))

    def _on_step(
        self, updates: list[Update], stats: SchedulerStats, counters: EngineCounters,
        iterations: list[IterationStats],
    ) -> None:  # fmt: skip
        outputs = [o for o in map(self._rebuild, updates) if o is not None]
        self.streams.set_stats(stats, counters)
        self.streams.deliver(outputs)
        for it in iterations:
            for listener in self._listeners:
                try:
                    listener(it)
                except Exception:
                    logger.exception("stats listener %r failed; continuing", listener)

    def _rebuild(self, update: Update) -> RequestOutput | None:
        request_id, finished, error, num_cached, prompt_logprobs, deltas, pooled = update
        state = self._requests.get(request_id)
        if state is None:
            return None  # aborted here already
        if finished:
            del self._requests[request_id]
        if prompt_logprobs is not None:
            state.prompt_logprobs = prompt_logprobs
        if state.kind == RequestOutputKind.DELTA:
            completions = [
                CompletionOutput(index, text, ids, reason, stop, lps, text, ids, lps)
                for index, text, ids, lps, reason, stop in deltas
            ]
        else:
            completions = [_accumulate(state, *delta) for delta in deltas]
            if state.kind == RequestOutputKind.FINAL_ONLY and not finished:
                return None
            prompt_logprobs = state.prompt_logprobs
        return RequestOutput(
            request_id, state.prompt, state.prompt_token_ids, completions, finished,
            prompt_logprobs, num_cached, error, pooled,
        )  # fmt: skip


def kill_engine_process(proc: Any) -> None:
    if proc.is_alive():  # it ignores SIGTERM (see engine_process_main)
        proc.kill()
        proc.join(5)


def _accumulate(
    state: _ClientRequest, index: int, text: str, token_ids: list[int],
    logprobs: list[Any] | None, finish_reason: str | None, stop_reason: int | str | None,
) -> CompletionOutput:  # fmt: skip
    full_text = state.texts.get(index, "") + text
    state.texts[index] = full_text
    ids = state.token_ids.setdefault(index, [])
    ids += token_ids
    lps = state.logprobs.get(index)
    if logprobs is not None:
        lps = (lps or []) + logprobs
        state.logprobs[index] = lps
    return CompletionOutput(
        index, full_text, ids[:], finish_reason, stop_reason,
        lps[:] if lps is not None else None, text, token_ids, logprobs,
    )  # fmt: skip
