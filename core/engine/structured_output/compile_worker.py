"""Compiling grammars in killable, memory-capped worker processes.

A grammar compile runs native code that cannot be interrupted, and a hostile constraint
can take minutes and gigabytes. So compiles do not run in the engine's process: a few
spawned worker processes do them, each driven by one thread of the engine's process that
waits (in ``Connection.poll``, without holding the GIL) for the answer::

    engine process                                    worker process (spawned)
    driver thread i ── ("load", key, backend) ──▶     unpickle the backend (its vocabulary),
                    ◀── ("loaded", key) ────────      then cap RLIMIT_AS at baseline + limit
                    ── ("compile", kind, spec, key) ▶ backend.compile(kind, spec)
                    ◀── ("ok", grammar) ─────────     (pickled back to the engine process)

- The backend (its token vocabulary, 1.9 MB pickled for the Qwen3 tokenizer) is sent
  once per worker; ``key`` names it, so a worker that has it is not sent it again.
- A compile past ``timeout_s`` gets its worker SIGKILLed; one that needs more than
  ``memory_bytes`` of address space above the worker's baseline fails to allocate, and the
  worker reports it (``MemoryError``) or dies (native code aborts). Either way the driver
  replaces the worker before taking the next job, and the job fails with
  ``CompileLimitError`` (the manager turns it into a 400).
- Workers are plain ``python -c`` children talking over a socket pair (not
  ``multiprocessing`` spawn, which would re-run the parent's ``__main__``). They are
  killed at the engine's exit, and exit by themselves when it dies (a closed pipe, or
  ``exit_with_parent`` for a worker busy compiling).
"""

from __future__ import annotations

import hashlib
import logging
import multiprocessing.connection
import os
import pickle
import queue
import signal
import socket
import subprocess
import sys
import threading
import time
import weakref
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass
from typing import Any

logger = logging.getLogger(__name__)

# Loading the backend into a fresh worker (interpreter start, imports, unpickling the
# vocabulary) is not the compile being bounded; it gets this long.
_LOAD_TIMEOUT_S = 300.0
_POLL_S = 0.05
# Exit codes of a worker whose native compile ran out of memory: an allocation failure
# aborts (Rust, C++ new), the kernel's OOM killer sends SIGKILL.
_OUT_OF_MEMORY_EXITS = (-signal.SIGABRT, -signal.SIGKILL)


class CompileLimitError(Exception):
    """A compile exceeded its deadline or memory cap; its worker was killed."""

    def __init__(self, reason: str, message: str) -> None:
        super().__init__(message)
        self.reason = reason  # "timeout" | "memory" | "crashed"


class CompileAbandoned(Exception):
    """Every caller of a queued compile gave up before it started, so it did not run."""


@dataclass(frozen=True)
class BackendPayload:
    """A pickled backend and its key (a digest of the bytes): what a worker compiles with."""

    key: str
    data: bytes

    @classmethod
    def of(cls, backend: Any) -> BackendPayload:
        data = pickle.dumps(backend, protocol=pickle.HIGHEST_PROTOCOL)
        return cls(hashlib.sha256(data).hexdigest()[:16], data)


@dataclass
class _Job:
    kind: str
    spec: Any
    future: Future[Any]
    should_run: Callable[[], bool]


# -- the worker process ---------------------------------------------------------------------


def _address_space_bytes() -> int:
    """This process's virtual memory size (VmSize), 0 where /proc is missing."""
    try:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[0]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        return 0


def _cap_memory(memory_bytes: int) -> None:
    """Cap the address space at what the worker uses now plus ``memory_bytes``.

    The baseline (interpreter, torch, the vocabulary) differs between machines, so the
    limit is what a compile may add on top of it. Only the soft limit is set: a worker
    sent a larger vocabulary later raises it again the same way."""
    import resource

    _, hard = resource.getrlimit(resource.RLIMIT_AS)
    soft = _address_space_bytes() + memory_bytes
    if hard != resource.RLIM_INFINITY:
        soft = min(soft, hard)
    resource.setrlimit(resource.RLIMIT_AS, (soft, hard))


def _send(conn: Any, msg: tuple[Any, ...]) -> None:
    try:
        conn.send_bytes(pickle.dumps(msg, protocol=pickle.HIGHEST_PROTOCOL))
    except MemoryError:
        conn.send_bytes(pickle.dumps(("memory", "the compiled grammar could not be sent")))


def main() -> None:
    """``python -c ... FD MEMORY_BYTES PARENT_PID``: the worker's process entry point.

    A plain interpreter rather than ``multiprocessing`` spawn, which re-runs the parent's
    ``__main__`` script in the child (an offline script calling ``LLM(...)`` at top level
    would load its model again in every worker)."""
    fd, memory_bytes, parent_pid = (int(v) for v in sys.argv[1:4])
    worker_main(multiprocessing.connection.Connection(fd), memory_bytes, parent_pid)


def worker_main(conn: Any, memory_bytes: int, parent_pid: int) -> None:
    """Load backends, compile, answer, until the engine's end of the pipe closes."""
    from engine.parent_watch import exit_with_parent

    exit_with_parent(parent_pid, "grammar-worker-parent-watch")
    backend: Any = None
    key: str | None = None
    while True:
        try:
            msg = conn.recv()
        except (EOFError, OSError):
            return
        if msg[0] == "load":
            backend = None
            _cap_memory(1 << 62)  # no cap while loading (the baseline is measured after)
            sys.path[:0] = [p for p in msg[3] if p not in sys.path]  # the backend's modules
            backend, key = pickle.loads(msg[2]), msg[1]
            _cap_memory(memory_bytes)
            _send(conn, ("loaded", key))
        elif msg[0] == "compile":
            _, kind, spec, want = msg
            if want != key or backend is None:
                _send(conn, ("error", f"worker has backend {key}, not {want}"))
                continue
            try:
                grammar = backend.compile(kind, spec)
                data = pickle.dumps(grammar, protocol=pickle.HIGHEST_PROTOCOL)
            except MemoryError:
                grammar = data = None
                _send(conn, ("memory", "out of memory"))
                continue
            except (ValueError, TypeError) as exc:
                _send(conn, ("invalid", type(exc).__name__, str(exc)))
                continue
            except Exception as exc:  # noqa: BLE001 - reported to the engine process
                _send(conn, ("error", f"{type(exc).__name__}: {exc}"))
                continue
            grammar = None
            _send(conn, ("ok", data))
            data = None


# -- the engine side ------------------------------------------------------------------------


class _Worker:
    """One worker process and what it holds, driven by one thread."""

    def __init__(self, name: str, memory_bytes: int) -> None:
        self.name = name
        self.memory_bytes = memory_bytes
        self.proc: Any = None
        self.conn: Any = None
        self.key: str | None = None
        self.num_started = 0

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def start(self, payload: BackendPayload) -> None:
        """A running worker holding ``payload`` (started and loaded if needed)."""
        if not self.alive():
            self.kill()
            ours, theirs = socket.socketpair()
            code = "from engine.structured_output.compile_worker import main; main()"
            args = [str(theirs.fileno()), str(self.memory_bytes), str(os.getpid())]
            try:
                self.proc = subprocess.Popen(
                    [sys.executable, "-c", code, *args],
                    pass_fds=(theirs.fileno(),),
                    stdin=subprocess.DEVNULL,
                )
            finally:
                theirs.close()
            self.conn, self.key = multiprocessing.connection.Connection(ours.detach()), None
            self.num_started += 1
        if self.key != payload.key:
            self.conn.send(("load", payload.key, payload.data, list(sys.path)))
            reply = self._wait(time.monotonic() + _LOAD_TIMEOUT_S)
            if reply is None or reply[0] != "loaded":  # died, or wedged while loading
                self.kill()
                raise RuntimeError(
                    "the grammar compile worker failed to start "
                    f"({'no answer' if reply is None else reply})"
                )
            self.key = payload.key

    def _wait(self, deadline: float) -> tuple[Any, ...] | None:
        """The worker's answer; ``("died", exitcode)`` when it died (a native compile out
        of memory aborts the process), ``None`` when the deadline passed first."""
        while time.monotonic() < deadline:
            try:
                if self.conn.poll(min(_POLL_S, max(0.0, deadline - time.monotonic()))):
                    answer: tuple[Any, ...] = pickle.loads(self.conn.recv_bytes())
                    return answer
            except (EOFError, OSError):
                break  # the pipe closed: the worker is exiting
            if self.proc.poll() is not None:
                break
        else:
            return None
        try:
            exitcode = self.proc.wait(5)
        except subprocess.TimeoutExpired:
            exitcode = None
        return ("died", exitcode)

    def compile(self, kind: str, spec: Any, key: str, timeout_s: float) -> tuple[Any, ...]:
        """The answer of one compile; ``("timeout",)`` (the worker was killed) or
        ``("died", exitcode)`` when it did not answer."""
        self.conn.send(("compile", kind, spec, key))
        answer = self._wait(time.monotonic() + timeout_s)
        if answer is None or answer[0] == "died":
            self.kill()
        return ("timeout",) if answer is None else answer

    def kill(self) -> None:
        if self.proc is not None:
            if self.proc.poll() is None:
                self.proc.kill()  # SIGKILL: native code does not see Python signals
            try:
                self.proc.wait(5)
            except subprocess.TimeoutExpired:
                logger.warning("grammar compile worker %d did not exit", self.proc.pid)
        if self.conn is not None:
            self.conn.close()
        self.proc = self.conn = self.key = None


def _kill_all(workers: list[_Worker]) -> None:
    """At interpreter exit (or ``kill_now``): no worker outlives the engine's process."""
    for worker in workers:
        proc = worker.proc
        if proc is not None and proc.poll() is None:
            proc.kill()


class CompileWorkerPool:
    """``num_workers`` worker processes compiling submitted jobs in FIFO order.

    ``payload`` is called (on a driver thread, once) for the backend the workers load.
    """

    def __init__(
        self,
        payload: Callable[[], BackendPayload],
        num_workers: int,
        timeout_s: float,
        memory_bytes: int,
        name: str = "engine-grammar",
    ) -> None:
        self.timeout_s = timeout_s
        self.memory_bytes = memory_bytes
        self._payload_fn = payload
        self._payload: BackendPayload | None = None
        self._payload_lock = threading.Lock()
        self._jobs: queue.SimpleQueue[_Job | None] = queue.SimpleQueue()
        self._workers = [_Worker(f"{name}-worker-{i}", memory_bytes) for i in range(num_workers)]
        self._threads = [
            threading.Thread(target=self._drive, args=(w,), name=f"{name}-{i}", daemon=True)
            for i, w in enumerate(self._workers)
        ]
        self._closed = False
        self.num_killed = 0
        weakref.finalize(self, _kill_all, self._workers)
        for thread in self._threads:
            thread.start()

    def payload(self) -> BackendPayload:
        with self._payload_lock:
            if self._payload is None:
                self._payload = self._payload_fn()
            return self._payload

    def submit(
        self, kind: str, spec: Any, should_run: Callable[[], bool] = lambda: True
    ) -> Future[Any]:
        """A future of the compiled grammar, or of ``CompileLimitError`` /
        ``CompileAbandoned`` / the backend's ``ValueError``."""
        if self._closed:
            raise RuntimeError("the grammar compile pool is closed")
        future: Future[Any] = Future()
        self._jobs.put(_Job(kind, spec, future, should_run))
        return future

    def start_workers(self) -> list[Future[Any]]:
        """Spawn and load the workers now (futures done once each start job ran)."""
        futures: list[Future[Any]] = []
        for _ in self._workers:
            futures.append(Future())
            self._jobs.put(_Job("", None, futures[-1], lambda: True))
        return futures

    def worker_pids(self) -> list[int | None]:
        return [w.proc.pid if w.alive() else None for w in self._workers]

    def _drive(self, worker: _Worker) -> None:
        while True:
            job = self._jobs.get()
            if job is None:
                worker.kill()
                return
            if not job.future.set_running_or_notify_cancel():
                continue
            try:
                payload = self.payload()
                worker.start(payload)
            except BaseException as exc:  # noqa: BLE001 - delivered to the callers
                job.future.set_exception(exc)
                continue
            if not job.kind:  # start_workers: the worker is up
                job.future.set_result(None)
                continue
            if not job.should_run():
                job.future.set_exception(CompileAbandoned("every caller gave up"))
                continue
            try:
                job.future.set_result(self._run(worker, job, payload))
            except BaseException as exc:  # noqa: BLE001 - delivered to the callers
                job.future.set_exception(exc)
            if not worker.alive() and not self._closed:  # killed: replace it now
                try:
                    worker.start(payload)
                except Exception:  # noqa: BLE001 - retried when the next job needs it
                    logger.exception("could not restart a grammar compile worker")

    def _run(self, worker: _Worker, job: _Job, payload: BackendPayload) -> Any:
        answer = worker.compile(job.kind, job.spec, payload.key, self.timeout_s)
        tag = answer[0]
        if tag == "ok":
            return pickle.loads(answer[1])
        if tag == "invalid":
            error_cls = TypeError if answer[1] == "TypeError" else ValueError
            raise error_cls(answer[2])
        if self._closed:
            raise RuntimeError("the grammar compile pool was closed during the compile")
        if tag in ("timeout", "died", "memory"):
            if tag != "memory":
                self.num_killed += 1
            if tag == "memory":  # the worker survived, but its heap may be fragmented
                worker.kill()
            reason = tag
            if tag == "died":  # native code out of memory aborts (or the kernel kills it)
                reason = "memory" if answer[1] in _OUT_OF_MEMORY_EXITS else "crashed"
            logger.warning(
                "grammar compile of a %s constraint: %s (worker %s)",
                job.kind,
                "deadline passed, worker killed" if tag == "timeout" else f"{tag} {answer[1:]}",
                worker.name,
            )
            raise CompileLimitError(reason, tag)
        raise RuntimeError(f"grammar compile worker error: {answer[1:]}")

    def close(self) -> None:
        """Stop the drivers after the queued jobs and kill the workers (a compile in
        progress is killed when its driver reaches the stop)."""
        if self._closed:
            return
        self._closed = True
        for _ in self._threads:
            self._jobs.put(None)

    def kill_now(self) -> None:
        """Kill every worker at once (interpreter exit, tests)."""
        self.close()
        _kill_all(self._workers)
