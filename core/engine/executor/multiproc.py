"""Tensor parallelism from the engine's side: one spawned worker process per rank.

The scheduler stays in the engine process. Each step, ``MultiprocExecutor.execute`` sends
the ``SchedulerOutput`` (as JSON, see ``step_codec``) to every worker, every worker runs
its model shard (the collectives between them go over ``torch.distributed``), and rank 0's
sampled tokens come back::

    engine process                         worker processes (spawn)
    Scheduler ─> MultiprocExecutor ──pipe──> rank 0: ModelRunner shard ─┐ all-reduce,
                      ▲                 └──> rank 1: ModelRunner shard ─┘ all-gather
                      └──── rank 0's ModelRunnerOutput (JSON) ◄─┘

Failure handling: while waiting, the executor watches every worker's pipe and process
sentinel. A worker that raises sends its traceback and exits; one that is killed closes
its sentinel. Either way the executor collects what the other ranks report for a moment,
stops every worker and raises ``WorkerFailedError`` naming the rank that failed first
(killed ranks before ranks that only reported a broken collective), with its error text.
Workers are daemons, stopped by ``shutdown()``, when the executor is garbage collected and
at interpreter exit; they also exit when the engine's pipe closes or its process dies.
"""

from __future__ import annotations

import json
import logging
import multiprocessing
import os
import signal
import socket
import time
import weakref
from dataclasses import asdict, dataclass, replace
from multiprocessing.connection import Connection, wait
from typing import TYPE_CHECKING, Any

from engine.config import EngineArgs
from engine.core.scheduler_output import ModelRunnerOutput, SchedulerOutput
from engine.errors import EngineError, StartupError, WorkerFailedError
from engine.executor import multinode
from engine.executor.step_codec import StepEncoder, dumps, loads, runner_output_from_dict
from engine.executor.validation import MAIN_GUARD_HINT, check_tensor_parallel
from engine.executor.worker_main import run_worker

if TYPE_CHECKING:
    from engine.plugins import PluginManager

logger = logging.getLogger(__name__)

__all__ = ["MultiprocExecutor", "WorkerFailedError"]

_POLL_S = 1.0  # how often a wait re-checks (sentinels wake it at once anyway)
_FAILURE_GRACE_S = 2.0  # after a failure, how long to collect the other ranks' reports
_SHUTDOWN_JOIN_S = 5.0


@dataclass
class _WorkerHandle:
    rank: int
    process: Any  # multiprocessing.Process of the spawn context
    conn: Connection

    @property
    def pid(self) -> int | None:
        pid: int | None = self.process.pid
        return pid


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def _describe_exit(code: int | None) -> str:
    if code is None:
        return "is still running"
    if code < 0:
        try:
            return f"was killed by signal {signal.Signals(-code).name}"
        except ValueError:
            return f"was killed by signal {-code}"
    return f"exited with code {code}"


def _stop_workers(workers: list[_WorkerHandle], graceful: bool) -> None:
    """Ask workers to exit (graceful), then terminate, then kill what is left."""
    if graceful:
        for w in workers:
            if w.process.is_alive():
                try:
                    w.conn.send_bytes(dumps({"op": "shutdown"}))
                except OSError:
                    pass
        deadline = time.monotonic() + _SHUTDOWN_JOIN_S
        for w in workers:
            w.process.join(max(0.0, deadline - time.monotonic()))
    for w in workers:
        if w.process.is_alive():
            w.process.terminate()
    for w in workers:
        w.process.join(2.0)
        if w.process.is_alive():
            w.process.kill()
            w.process.join(2.0)
    for w in workers:
        w.conn.close()


def worker_engine_args(args: EngineArgs, pm: PluginManager) -> EngineArgs:
    """The workers' args: ``plugins`` is the engine's resolved set (each loaded plugin
    required, every other one blocked), so no rank re-decides which plugins to load."""
    return replace(args, plugins=pm.worker_args())


class MultiprocExecutor:
    """Runs ``args.tensor_parallel_size`` ranks in worker processes; a drop-in runner for
    ``EngineCore`` (``execute``, ``num_blocks``, ``block_size``, ``max_model_len``,
    ``vocab_size``)."""

    def __init__(self, args: EngineArgs, pm: PluginManager, source: Any) -> None:
        check_tensor_parallel(args, pm, source.hf_config)
        self.tensor_parallel_size = args.tensor_parallel_size
        self._encoder = StepEncoder()
        self._failure: EngineError | None = None
        self._errors: dict[int, dict[str, Any]] = {}
        start = time.monotonic()
        self._workers = self._start_workers(worker_engine_args(args, pm))
        self._finalizer = weakref.finalize(self, _stop_workers, self._workers, True)
        try:
            infos = self._wait_replies("startup")
        except BaseException:
            self.shutdown()
            raise
        first = infos[0]
        self.block_size: int = first["block_size"]
        self.max_model_len: int = first["max_model_len"]
        self.vocab_size: int = first["vocab_size"]
        self.num_blocks_per_rank = [infos[r]["num_blocks"] for r in sorted(infos)]
        self.num_blocks: int = min(self.num_blocks_per_rank)
        self.weights_bytes_per_rank = [infos[r]["weights_bytes"] for r in sorted(infos)]
        logger.info(
            "tensor parallel: %d workers ready in %.1f s on %s; KV blocks per rank %s, using %d",
            len(self._workers),
            time.monotonic() - start,
            ", ".join(infos[r]["device"] for r in sorted(infos)),
            self.num_blocks_per_rank,
            self.num_blocks,
        )

    # -- startup --------------------------------------------------------------------------

    def _start_workers(self, args: EngineArgs) -> list[_WorkerHandle]:
        ctx = multiprocessing.get_context("spawn")
        size = args.tensor_parallel_size
        init_method = f"tcp://127.0.0.1:{_free_port()}"
        local_ranks = list(range(size))
        if args.nnodes > 1:  # the other nodes' ranks connect over TCP (multinode.py)
            init_method = multinode.init_method(args)
            local_ranks = multinode.node_ranks(args)
        args_json = json.dumps(asdict(args))
        workers: list[_WorkerHandle] = []
        try:
            for rank in local_ranks:
                parent_conn, child_conn = ctx.Pipe()
                process = ctx.Process(
                    target=run_worker,
                    args=(rank, size, args_json, init_method, child_conn, os.getpid()),
                    name=f"EngineWorker-TP{rank}",
                    daemon=True,
                )
                process.start()
                child_conn.close()
                workers.append(_WorkerHandle(rank, process, parent_conn))
            remote = [r for r in range(size) if r not in local_ranks]
            if remote:
                for rank, conn in sorted(multinode.accept_remote_ranks(args, remote).items()):
                    workers.append(_WorkerHandle(rank, multinode.RemoteProcess(conn), conn))
        except BaseException:
            _stop_workers(workers, graceful=False)
            raise
        return workers

    @property
    def worker_pids(self) -> list[int | None]:
        return [w.pid for w in self._workers]

    # -- one step -------------------------------------------------------------------------

    def execute(self, scheduler_output: SchedulerOutput) -> ModelRunnerOutput:
        if self._failure is not None:
            raise self._failure
        try:
            payload = dumps(self._encoder.encode(scheduler_output))
        except BaseException:
            self._encoder = StepEncoder()  # nothing was sent: resend whole requests next time
            raise
        for w in self._workers:
            try:
                w.conn.send_bytes(payload)
            except OSError:
                raise self._fail("step") from None
        replies = self._wait_replies("step")
        return runner_output_from_dict(replies[0])

    def _wait_replies(self, phase: str) -> dict[int, dict[str, Any]]:
        """One message from every rank; a failure anywhere raises (after stopping all)."""
        replies: dict[int, dict[str, Any]] = {}
        pending = {w.rank for w in self._workers}
        while pending:
            conns = {self._workers[r].conn: r for r in pending}
            sentinels = {
                w.process.sentinel: w.rank
                for w in self._workers
                if w.process.sentinel is not None  # a remote rank: its connection's EOF
            }
            for ready in wait([*conns, *sentinels], timeout=_POLL_S):
                if ready not in conns:
                    raise self._fail(phase)
                rank = conns[ready]
                message = self._recv(rank)
                if message is None or message.get("op") == "error":
                    raise self._fail(phase)
                replies[rank] = message
                pending.discard(rank)
        return replies

    def _recv(self, rank: int) -> dict[str, Any] | None:
        """The next message of ``rank``; error reports are kept in ``_errors``."""
        try:
            message = loads(self._workers[rank].conn.recv_bytes())
        except (EOFError, OSError):
            return None
        if message.get("op") == "error":
            self._errors.setdefault(rank, message)
        return message

    # -- failures -------------------------------------------------------------------------

    def _collect_reports(self) -> None:
        """Read error reports until every worker has exited or the grace period ends."""
        deadline = time.monotonic() + _FAILURE_GRACE_S
        while True:
            for w in self._workers:
                while w.rank not in self._errors and self._poll(w):
                    if self._recv(w.rank) is None:
                        break
            if all(not w.process.is_alive() for w in self._workers):
                break
            if time.monotonic() >= deadline:
                break
            time.sleep(0.05)

    @staticmethod
    def _poll(w: _WorkerHandle) -> bool:
        try:
            return w.conn.poll()
        except (EOFError, OSError):
            return False

    def _fail(self, phase: str) -> EngineError:
        """Stop every worker and build the error that names the failed rank."""
        self._collect_reports()
        exit_codes = {w.rank: w.process.exitcode for w in self._workers}
        _stop_workers(self._workers, graceful=False)
        self._finalizer.detach()
        error = self._failure_error(phase, exit_codes)
        self._failure = error
        return error

    def _describe(self, rank: int, exit_codes: dict[int, int | None]) -> str | None:
        pid = self._workers[rank].pid
        report = self._errors.get(rank)
        if report is not None:
            return f"rank {rank} (pid {pid}) raised {report['type']}: {report['message']}"
        code = exit_codes[rank]
        if code is None:
            return None  # still running: stopped by the engine, not a cause
        return f"rank {rank} (pid {pid}) {_describe_exit(code)} without reporting an error"

    def _failure_error(self, phase: str, exit_codes: dict[int, int | None]) -> EngineError:
        ranks = [w.rank for w in self._workers]
        # A rank that died silently (killed) is the cause; its peers only saw a broken
        # collective. Otherwise the first rank that reported an error.
        killed = [r for r in ranks if r not in self._errors and exit_codes[r] not in (None, 0)]
        first = (killed or sorted(self._errors) or ranks)[0]
        report = self._errors.get(first)
        if phase == "startup" and report is not None and report["type"] == "StartupError":
            return StartupError(f"tensor-parallel rank {first}: {report['message']}")
        where = "while starting" if phase == "startup" else "during a step"
        described = self._describe(first, exit_codes) or f"rank {first} stopped answering"
        parts = [f"tensor-parallel worker rank {first} failed {where}: {described}"]
        others = [d for r in ranks if r != first and (d := self._describe(r, exit_codes))]
        if others:
            parts.append("other ranks: " + "; ".join(others))
        if report is not None:
            parts.append(f"traceback of rank {first}:\n{report['traceback'].rstrip()}")
        elif phase == "startup" and exit_codes[first] == 1:
            parts.append(
                "its error is printed above; if your script creates the engine at import "
                "time: " + MAIN_GUARD_HINT
            )
        parts.append("the engine cannot continue; restart it")
        cls = StartupError if phase == "startup" else WorkerFailedError
        return cls("\n".join(parts))

    # -- shutdown -------------------------------------------------------------------------

    def shutdown(self) -> None:
        """Stop the workers (idempotent); the executor cannot run steps afterwards."""
        if self._finalizer.detach() is not None:
            _stop_workers(self._workers, graceful=self._failure is None)
        if self._failure is None:
            self._failure = EngineError("the engine was shut down")
