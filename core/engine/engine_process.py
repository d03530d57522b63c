"""The engine core in its own process, so the HTTP server and the engine do not share a GIL.

    server process                                     engine process (spawned)
    ProcessAsyncLLM (AsyncLLM's API)
      generate() ── prepare (tokenize, validate)
                 ── inbox ─▶ sender thread ── pipe ─▶  LLMEngine: apply adds/aborts,
                                                       step(), detokenize, stop strings
      streams ◀─ receiver thread ◀── pipe ── one message per step: the outputs' deltas,
                 (one event-loop wake-up)               scheduler stats, counters, stats

In one process, the engine thread releases the GIL around every torch call and must win
it back from the event loop each time; under 256 streams those waits cost more than the
GPU step. Here each process has its own interpreter and the pipe carries only what changed.

The server process keeps a model-less ``LLMEngine`` for tokenization, chat templates,
sampling defaults and grammar validation (cheap checks, never a compile); the engine
process builds the full engine from the same ``EngineArgs`` and compiles each grammar (in
its compile worker processes) before queueing the request that needs it. A startup error
in the engine process is re-raised here as ``StartupError``; if the process dies later,
every request fails with ``EngineDeadError``.
"""

from __future__ import annotations

import logging
import multiprocessing
import multiprocessing.connection
import os
import signal
import threading
import time
from dataclasses import dataclass, field
from typing import Any

from engine.async_llm import AsyncLLM, _Abort, _Add
from engine.config import EngineArgs
from engine.errors import (
    EngineDeadError,
    RequestValidationError,
    StartupError,
    from_wire,
    to_wire,
)
from engine.llm_engine import LLMEngine
from engine.log_setup import configure_logging
from engine.outputs import CompletionOutput, RequestOutput
from engine.outputs_processing import EngineCounters, IterationStats
from engine.parent_watch import exit_with_parent
from engine.sampling_params import RequestOutputKind

logger = logging.getLogger(__name__)

_STARTUP_TIMEOUT_S = 3600.0  # weights of a large model can take a long time to load
_HEARTBEAT_S = 1.0


# -- what crosses the pipe ------------------------------------------------------------------
# Per step: ("step", updates, scheduler stats, counters, iteration stats). Each update is a
# plain tuple (unpickling 256 tuples takes a tenth of the time 256 dataclasses take):
#   (request_id, finished, error, num_cached_tokens, prompt_logprobs or None, deltas)
# with deltas = ((index, delta_text, delta_token_ids, delta_logprobs, finish_reason,
# stop_reason), ...); prompt logprobs travel once, with a request's first update.

_Update = tuple[
    str, bool, "str | None", int, "list[Any] | None", tuple[tuple[Any, ...], ...],
    "list[float] | None",
]  # fmt: skip


def _to_update(out: RequestOutput, send_prompt_logprobs: bool) -> _Update:
    deltas = tuple(
        (c.index, c.delta_text, c.delta_token_ids, c.delta_logprobs, c.finish_reason,
         c.stop_reason)
        for c in out.outputs
    )  # fmt: skip
    prompt_logprobs = out.prompt_logprobs if send_prompt_logprobs else None
    return (out.request_id, out.finished, out.error, out.num_cached_tokens, prompt_logprobs,
            deltas, out.pooled)  # fmt: skip


# -- the engine process ---------------------------------------------------------------------


def engine_process_main(
    clients: list[Any], args: EngineArgs, log_level: int, parent_pid: int
) -> None:
    """Entry point of the engine process: build the engine, then serve its clients' pipes
    (one per API server process)."""
    configure_logging(log_level)
    # The server process owns the lifecycle (it drains on SIGTERM / Ctrl-C, then stops this
    # process through the pipe): a signal sent to the whole process group must not kill
    # the engine under requests that are still draining.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    exit_with_parent(parent_pid, "parent-watch")
    try:
        engine = LLMEngine.from_args(args)
    except BaseException as exc:  # noqa: BLE001 - reported to the server process
        for conn in clients:
            _post(conn, ("failed", *to_wire(exc)))
        return
    for conn in clients:
        _post(conn, ("ready", engine.max_model_len, engine.vocab_size, engine.stats()))
    try:
        _EngineLoop(engine, clients).run()
    finally:
        for conn in clients:
            conn.close()


def _post(conn: Any, msg: tuple[Any, ...]) -> bool:
    """Send to one client; False when it is gone (the caller drops it)."""
    try:
        conn.send(msg)
    except (OSError, EOFError):
        return False
    return True


class _Aborted(Exception):
    """A request aborted while its grammar compiled (never reached the engine)."""


class _EngineLoop:
    """Apply the clients' adds and aborts, step, send each client its requests' updates.

    Every client gets every step's scheduler stats, counters and iteration stats (so each
    API server's /metrics describes the whole engine), but only its own requests' updates.
    A client that sends "stop" or goes away is dropped and its requests are aborted; the
    loop ends when no client is left.
    """

    def __init__(self, engine: LLMEngine, clients: list[Any]) -> None:
        self.engine, self.clients = engine, list(clients)
        self.owner: dict[str, Any] = {}  # request id -> the client that added it
        self.iterations: list[IterationStats] = []
        engine.add_stats_listener(lambda it: self.iterations.append(it))
        self.compiling: list[tuple[Any, Any]] = []  # (prepared, future) waiting for a grammar
        self.seen: set[str] = set()  # requests whose prompt logprobs were sent
        self.last_send = time.monotonic()

    def run(self) -> None:
        while self.clients:
            busy = self.engine.has_unfinished_requests()
            timeout = 0.0 if busy else (0.005 if self.compiling else _HEARTBEAT_S)
            while self.clients:
                ready = multiprocessing.connection.wait(self.clients, timeout)
                if not ready:
                    break
                for conn in ready:
                    self._receive(conn)
                timeout = 0.0
            if not self.clients:
                return
            self._add_compiled()
            outputs: list[RequestOutput] = []
            if self.engine.has_unfinished_requests():
                try:
                    outputs = self.engine.step()
                except Exception as exc:
                    logger.exception("engine step failed; failing the requests in flight")
                    outputs = self.engine.fail_all_requests(f"engine step failed: {exc!r}")
            if outputs or self.iterations or time.monotonic() - self.last_send > _HEARTBEAT_S:
                self._send(outputs)

    def _receive(self, conn: Any) -> None:
        try:
            msg = conn.recv()
        except (EOFError, OSError):
            self._drop(conn)  # its server process died
            return
        if msg[0] == "stop":
            self._drop(conn)
        else:
            self._handle(conn, msg)

    def _drop(self, conn: Any) -> None:
        """Forget a client: abort what it still had running (nobody will read it)."""
        if conn not in self.clients:
            return
        self.clients.remove(conn)
        mine = [rid for rid, owner in self.owner.items() if owner is conn]
        gone = set(mine)
        self.compiling = [c for c in self.compiling if c[0].request_id not in gone]
        if mine:
            self.engine.abort_request(mine)
            for rid in mine:
                self.owner.pop(rid, None)
                self.seen.discard(rid)
        conn.close()

    def _handle(self, conn: Any, msg: tuple[Any, ...]) -> None:
        if msg[0] == "add":
            prepared = msg[1]
            request_id = prepared.request_id
            if request_id in self.owner:  # another API server runs this id
                error = RequestValidationError(
                    f"request id {request_id!r} is already running; use a unique id"
                )
                self._reply_added(conn, request_id, error)
                return
            self.owner[request_id] = conn
            structured = prepared.params.structured_outputs
            if structured is None:
                self._add(prepared)
            else:  # compile off this loop; add once the grammar is ready
                future = self.engine.compile_structured_outputs_async(structured)
                self.compiling.append((prepared, future))
        elif msg[0] == "abort":
            ids = {rid for rid in msg[1] if self.owner.get(rid) is conn}
            for prepared, _ in [c for c in self.compiling if c[0].request_id in ids]:
                self._reply_added(conn, prepared.request_id, _Aborted("aborted before it started"))
                del self.owner[prepared.request_id]
            self.compiling = [c for c in self.compiling if c[0].request_id not in ids]
            self._send(self.engine.abort_request([rid for rid in msg[1] if rid in ids]))

    def _add_compiled(self) -> None:
        waiting = []
        for prepared, future in self.compiling:
            if not future.done():
                waiting.append((prepared, future))
            elif future.exception() is not None:
                self._fail_add(prepared.request_id, future.exception())
            else:
                self._add(prepared)
        self.compiling = waiting

    def _add(self, prepared: Any) -> None:
        if prepared.request_id not in self.owner:
            return  # its client went away while the grammar compiled
        # Only deltas cross the pipe: the engine keeps no cumulative copies (the client
        # rebuilds them for the requests that asked for them).
        prepared.params.output_kind = RequestOutputKind.DELTA
        for request in prepared.core_requests:
            request.sampling_params.output_kind = RequestOutputKind.DELTA
        try:
            self.engine.add_prepared_request(prepared)
        except Exception as exc:
            self._fail_add(prepared.request_id, exc)
            return
        self._reply_added(self.owner[prepared.request_id], prepared.request_id, None)

    def _fail_add(self, request_id: str, exc: BaseException | None) -> None:
        conn = self.owner.pop(request_id, None)
        if conn is not None:
            self._reply_added(conn, request_id, exc)

    def _reply_added(self, conn: Any, request_id: str, exc: BaseException | None) -> None:
        error = None if exc is None else to_wire(exc)
        if not _post(conn, ("added", request_id, error)):
            self._drop(conn)

    def _send(self, outputs: list[RequestOutput]) -> None:
        updates: dict[Any, list[_Update]] = {conn: [] for conn in self.clients}
        for out in outputs:
            request_id = out.request_id
            first = request_id not in self.seen
            if first:
                self.seen.add(request_id)
            conn = self.owner.get(request_id)
            if out.finished:
                self.seen.discard(request_id)
                self.owner.pop(request_id, None)
            if conn in updates:
                updates[conn].append(_to_update(out, first))
        stats, counters = self.engine.stats(), self.engine.counters()
        for conn, mine in updates.items():
            if not _post(conn, ("step", mine, stats, counters, self.iterations)):
                self._drop(conn)
        self.iterations = []
        self.last_send = time.monotonic()


# -- the server side ------------------------------------------------------------------------


@dataclass
class _ClientRequest:
    """What the server has of a request: its output kind, and what rebuilding cumulative
    outputs needs (``CUMULATIVE`` and ``FINAL_ONLY`` requests only)."""

    prompt: str | None
    prompt_token_ids: list[int]
    kind: RequestOutputKind
    texts: dict[int, str] = field(default_factory=dict)
    token_ids: dict[int, list[int]] = field(default_factory=dict)
    logprobs: dict[int, list[Any] | None] = field(default_factory=dict)
    prompt_logprobs: list[Any] | None = None


@dataclass(frozen=True)
class EngineReady:
    """What a started engine process reports, which each front end needs."""

    max_model_len: int
    vocab_size: int
    stats: Any


def start_engine_process(
    args: EngineArgs, num_clients: int = 1, start_timeout: float = _STARTUP_TIMEOUT_S
) -> tuple[Any, list[Any], EngineReady]:
    """Spawn the engine process with one pipe per client (API server process) and wait
    until it has loaded the model: ``(process, client connections, EngineReady)``.

    A startup failure raises ``StartupError`` (and the process is gone)."""
    proc, conns = spawn_engine_process(args, num_clients)
    return proc, conns, wait_engine_ready(proc, conns, start_timeout)


def spawn_engine_process(
    args: EngineArgs, num_clients: int = 1, env: dict[str, str] | None = None, name: str = ""
) -> tuple[Any, list[Any]]:
    """Start an engine process without waiting for it: ``(process, client connections)``.

    ``env``: variables the process starts with (``CUDA_VISIBLE_DEVICES`` of one data
    parallel rank); a spawned child copies the parent's environment when it starts."""
    ctx = multiprocessing.get_context("spawn")
    pairs = [ctx.Pipe(duplex=True) for _ in range(num_clients)]
    level = logging.getLogger().getEffectiveLevel()
    proc = ctx.Process(
        target=engine_process_main,
        args=([child for _, child in pairs], args, level, os.getpid()),
        name=name or "engine-core",
    )
    saved = {k: os.environ.get(k) for k in env or {}}
    try:
        os.environ.update(env or {})
        proc.start()
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value
    for _, child in pairs:
        child.close()
    return proc, [conn for conn, _ in pairs]


def wait_engine_ready(
    proc: Any, conns: list[Any], start_timeout: float = _STARTUP_TIMEOUT_S
) -> EngineReady:
    """Wait until a spawned engine process has loaded the model (``StartupError`` if it
    fails; the process is gone then)."""
    try:
        deadline = time.monotonic() + start_timeout
        readies = [_wait_ready(proc, conn, deadline, start_timeout) for conn in conns]
    except BaseException:
        kill_engine_process(proc)
        raise
    return readies[0]


def kill_engine_process(proc: Any) -> None:
    if proc.is_alive():  # it ignores SIGTERM (see engine_process_main)
        proc.kill()
        proc.join(5)


def _wait_ready(proc: Any, conn: Any, deadline: float, timeout: float) -> EngineReady:
    while not conn.poll(1.0):
        if not proc.is_alive():
            raise StartupError(
                f"the engine process exited during startup (exit code {proc.exitcode})"
            )
        if time.monotonic() > deadline:
            raise StartupError(f"the engine process did not start within {timeout:g} s")
    msg = conn.recv()
    if msg[0] == "failed":
        code, text = msg[1], msg[2]
        if code == "internal_error":
            raise StartupError(f"the engine failed to start: {text}")
        raise StartupError(text)
    return EngineReady(int(msg[1]), int(msg[2]), msg[3])


class ProcessAsyncLLM(AsyncLLM):
    """``AsyncLLM`` whose engine runs in a spawned process (same API for the server).

    ``from_args`` starts a private engine process; an API server process of
    ``--api-server-count`` > 1 attaches to the shared one with its own connection
    (``proc`` None: the supervisor owns the process).
    """

    def __init__(self, args: EngineArgs, conn: Any, ready: EngineReady, proc: Any = None) -> None:
        self._conn, self._proc = conn, proc
        front = LLMEngine.frontend_from_args(args, ready.max_model_len, ready.vocab_size)
        self._queued_reqs_bound = args.max_num_queued_reqs
        self._listeners: list[Any] = []
        self._requests: dict[str, _ClientRequest] = {}
        self._pending_adds: dict[str, Any] = {}
        self._stopping = False  # set by the sender once it asked the engine to stop
        super().__init__(front, start=False, initial_stats=ready.stats)
        self._last_message = time.monotonic()
        self._thread = threading.Thread(target=self._run, name="engine-receiver", daemon=True)
        self._sender = threading.Thread(target=self._send_loop, name="engine-sender", daemon=True)
        self._sender.start()
        self._thread.start()

    @classmethod
    def from_args(cls, args: EngineArgs) -> ProcessAsyncLLM:
        proc, conns, ready = start_engine_process(args)
        try:
            return cls(args, conns[0], ready, proc)
        except BaseException:
            kill_engine_process(proc)
            raise

    # -- the parts of AsyncLLM that read the engine object ----------------------------------

    async def _compile_constraint(self, prepared: Any) -> None:
        """Nothing here: this process only validated the constraint (``prepare_request``);
        the engine process compiles it once, off its loop, before queueing the request."""

    def add_stats_listener(self, listener: Any) -> bool:
        self._listeners.append(listener)
        return True

    def _max_num_queued_reqs(self) -> int | None:
        return self._queued_reqs_bound

    def stalled_for(self) -> float:
        if not self._streams and self._inbox.empty():
            return 0.0
        return max(0.0, time.monotonic() - self._last_message - _HEARTBEAT_S)

    def silent_for(self) -> float:
        """Seconds the idle engine process has sent nothing beyond its heartbeat period (it
        reports at least once a second when idle); 0 while requests are in flight, where
        a long step is normal and ``stalled_for`` judges instead."""
        if self._streams or not self._inbox.empty():
            return 0.0
        return max(0.0, time.monotonic() - self._last_message - _HEARTBEAT_S)

    def declare_dead(self, reason: str) -> None:
        super().declare_dead(reason)
        self._fail_pending_adds(EngineDeadError(reason))
        self._kill()

    def _run(self) -> None:
        super()._run()  # fails the streams and the adds still in the inbox
        self._fail_pending_adds(self.dead_error or EngineDeadError("the engine process stopped"))

    def _fail_pending_adds(self, error: EngineDeadError) -> None:
        """Adds forwarded to the engine process and never answered (it died or is wedged):
        their callers still wait for the answer, so give them the error."""
        for request_id in list(self._pending_adds):
            done = self._pending_adds.pop(request_id, None)
            if done is not None:
                self._fail_add(done, error)

    def shutdown(self, timeout: float = 10.0) -> None:
        super().shutdown(timeout)
        if self._proc is not None:
            self._proc.join(timeout)
        self._kill()

    def _kill(self) -> None:
        if self._proc is not None:  # a shared engine process is the supervisor's to stop
            kill_engine_process(self._proc)

    def _exitcode(self) -> int | None:
        return None if self._proc is None else self._proc.exitcode

    # -- sender thread: inbox -> pipe ---------------------------------------------------------

    def _send_loop(self) -> None:
        from engine.async_llm import _STOP

        while True:
            cmd = self._inbox.get()
            try:
                if cmd is _STOP:
                    self._stopping = True
                    self._conn.send(("stop",))
                    return
                if isinstance(cmd, _Add):
                    self._forward_add(cmd)
                elif isinstance(cmd, _Abort):
                    # Streams stay until the engine's final (abort) output reaches them.
                    self._conn.send(("abort", cmd.request_ids))
            except (OSError, EOFError):
                return  # the engine process is gone; the receiver reports it

    def _forward_add(self, cmd: _Add) -> None:
        if not self._claim_add(cmd):
            return
        prepared = cmd.prepared
        request_id = prepared.request_id
        self._streams[request_id] = cmd.stream
        self._requests[request_id] = _ClientRequest(
            prepared.prompt, prepared.prompt_token_ids, prepared.params.output_kind
        )
        self._pending_adds[request_id] = cmd.done
        self._conn.send(("add", prepared))

    # -- receiver thread: pipe -> streams (AsyncLLM._run calls this as its loop) --------------

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
        self._streams.pop(request_id, None)
        self._requests.pop(request_id, None)
        done.set_exception(from_wire(*error))

    def _on_step(
        self, updates: list[_Update], stats: Any, counters: EngineCounters,
        iterations: list[IterationStats],
    ) -> None:  # fmt: skip
        outputs = [o for o in map(self._rebuild, updates) if o is not None]
        with self._stats_lock:
            self._last_stats, self._counters = stats, counters
        self._deliver(outputs)
        for it in iterations:
            for listener in self._listeners:
                try:
                    listener(it)
                except Exception:
                    logger.exception("stats listener %r failed; continuing", listener)

    def _rebuild(self, update: _Update) -> RequestOutput | None:
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
            completions = [self._accumulate(state, *delta) for delta in deltas]
            if state.kind == RequestOutputKind.FINAL_ONLY and not finished:
                return None
            prompt_logprobs = state.prompt_logprobs
        return RequestOutput(
            request_id, state.prompt, state.prompt_token_ids, completions, finished,
            prompt_logprobs, num_cached, error, pooled,
        )  # fmt: skip

    @staticmethod
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

    def _check_alive(self) -> None:
        super()._check_alive()
        if self._proc is not None and not self._proc.is_alive():
            raise EngineDeadError("the engine process is not running")


__all__ = [
    "EngineReady",
    "ProcessAsyncLLM",
    "engine_process_main",
    "kill_engine_process",
    "spawn_engine_process",
    "start_engine_process",
    "wait_engine_ready",
]
