"""The engine core in its own process, so the HTTP server and the engine do not share a GIL.

    server process                                     engine process (spawned)
    ProcessAsyncLLM = ClientStreams + ProcessLink
      generate() ── prepare (tokenize, validate)
                 ── inbox ─▶ sender thread ── pipe ─▶  _EngineLoop: LLMEngine: apply
                                                       adds/aborts, step(), detokenize,
                                                       stop strings
      streams ◀─ receiver thread ◀── pipe ── one message per step: the outputs' deltas,
                 (one event-loop wake-up)               scheduler stats, counters, stats

In one process, the engine thread releases the GIL around every torch call and must win
it back from the event loop each time; under 256 streams those waits cost more than the
GPU step. Here each process has its own interpreter and the pipe carries only what changed.

This file holds the engine process's side (``engine_process_main``, ``_EngineLoop``),
starting it, and ``ProcessAsyncLLM``, the client: the same ``ClientStreams`` as
``AsyncLLM`` with a ``ProcessLink`` (``process_link.py``: the pipe's messages and its
client end) where ``AsyncLLM`` has its engine thread. The client keeps a model-less
``LLMEngine`` for tokenization, chat templates, sampling defaults and grammar validation
(cheap checks, never a compile); the engine process builds the full engine from the same
``EngineArgs`` and compiles each grammar (in its compile worker processes) before queueing
the request that needs it. A startup error in the engine process is re-raised here as
``StartupError``; if the process dies later, every request fails with ``EngineDeadError``.
"""

from __future__ import annotations

import logging
import multiprocessing
import multiprocessing.connection
import os
import signal
import time
from collections.abc import AsyncGenerator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from engine.client_streams import ClientStreams
from engine.config import EngineArgs
from engine.engine_client import EngineLoad, load_of
from engine.errors import (
    EngineDeadError,
    RequestValidationError,
    StartupError,
    to_wire,
)
from engine.llm_engine import LLMEngine
from engine.log_setup import configure_logging
from engine.lora.request import LoRARequest
from engine.model_executor.pooling_task import PoolingConfig
from engine.outputs import RequestOutput, SchedulerStats
from engine.outputs_processing import EngineCounters, IterationStats
from engine.parent_watch import exit_with_parent
from engine.process_link import (
    HEARTBEAT_S,
    ProcessLink,
    Update,
    kill_engine_process,
    to_update,
)
from engine.sampling_params import RequestOutputKind, SamplingParams
from engine.tokenization.input_processor import PreparedRequest, PromptType

logger = logging.getLogger(__name__)

_STARTUP_TIMEOUT_S = 3600.0  # weights of a large model can take a long time to load


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
            timeout = 0.0 if busy else (0.005 if self.compiling else HEARTBEAT_S)
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
            if outputs or self.iterations or time.monotonic() - self.last_send > HEARTBEAT_S:
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
        updates: dict[Any, list[Update]] = {conn: [] for conn in self.clients}
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
                updates[conn].append(to_update(out, first))
        stats, counters = self.engine.stats(), self.engine.counters()
        for conn, mine in updates.items():
            if not _post(conn, ("step", mine, stats, counters, self.iterations)):
                self._drop(conn)
        self.iterations = []
        self.last_send = time.monotonic()


# -- starting it ---------------------------------------------------------------------------


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


# -- the client -----------------------------------------------------------------------------


class ProcessAsyncLLM:
    """``EngineClient`` whose engine runs in a spawned process: a ``ClientStreams`` served
    by a ``ProcessLink`` (same API for the server as ``AsyncLLM``).

    ``from_args`` starts a private engine process; an API server process of
    ``--api-server-count`` > 1 attaches to the shared one with its own connection
    (``proc`` None: the supervisor owns the process).
    """

    def __init__(self, args: EngineArgs, conn: Any, ready: EngineReady, proc: Any = None) -> None:
        self.engine = LLMEngine.frontend_from_args(args, ready.max_model_len, ready.vocab_size)
        self._streams = ClientStreams(
            self.engine, ready.stats, self.engine.counters(), args.max_num_queued_reqs
        )
        self._link = ProcessLink(conn, proc, self._streams)
        self._link.start()

    @classmethod
    def from_args(cls, args: EngineArgs) -> ProcessAsyncLLM:
        proc, conns, ready = start_engine_process(args)
        try:
            return cls(args, conns[0], ready, proc)
        except BaseException:
            kill_engine_process(proc)
            raise

    # -- what the API layer reads: the model-less engine's facts ------------------------------

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

    def add_stats_listener(self, listener: Any) -> bool:
        """``listener(IterationStats)`` for each step the engine process reports, called
        from the receiver thread (register before serving)."""
        self._link.add_stats_listener(listener)
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
        return self._link.silent_for()

    def declare_dead(self, reason: str) -> None:
        """Fail every request in flight and kill a private engine process (the watchdog,
        when the engine is wedged or silent)."""
        self._link.declare_dead(self._streams.declare_dead(reason))

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
        """Stop the engine process through the pipe (pending requests fail with
        ``EngineDeadError``); kill a private one that does not stop in time."""
        self._link.shutdown(timeout)


__all__ = [
    "EngineReady",
    "ProcessAsyncLLM",
    "engine_process_main",
    "kill_engine_process",
    "spawn_engine_process",
    "start_engine_process",
    "wait_engine_ready",
]
