"""The entry point of a worker process: build the rank's worker, then serve steps.

Messages are JSON bytes over the process's pipe to the engine (see ``step_codec``)::

    engine -> worker:  {"op": "execute", ...step...}  |  {"op": "shutdown"}
    worker -> engine:  {"op": "ready", num_blocks, ...}      once, after startup
                       {"op": "output", ...}  (rank 0)  |  {"op": "done"}  (other ranks)
                       {"op": "error", rank, type, message, traceback}   then exit 1

A worker exits when the engine closes the pipe or its parent process disappears (a
watchdog thread), so it never outlives the engine. Ctrl-C goes to the engine alone.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import traceback
from multiprocessing.connection import Connection
from typing import Any

from engine.executor.step_codec import StepDecoder, dumps, loads, runner_output_to_dict
from engine.parent_watch import exit_with_parent

__all__ = ["run_worker"]


def _report(conn: Connection, rank: int, exc: BaseException, started: bool) -> None:
    text = traceback.format_exc()
    print(f"engine worker rank {rank} failed:\n{text}", file=sys.stderr, flush=True)
    message: dict[str, Any] = {
        "op": "error",
        "rank": rank,
        "type": type(exc).__name__,
        "message": str(exc),
        "traceback": text,
        "started": started,
    }
    try:
        conn.send_bytes(dumps(message))
    except OSError:
        pass  # the engine is gone; nothing left to tell


def _serve(worker: Any, conn: Connection, rank: int) -> None:
    decoder = StepDecoder()
    while True:
        try:
            message = loads(conn.recv_bytes())
        except EOFError:
            return  # the engine closed the pipe
        op = message.get("op")
        if op == "shutdown":
            return
        if op != "execute":
            raise ValueError(f"unknown message op {op!r} from the engine")
        output = worker.execute(decoder.decode(message))
        reply = {"op": "output", **runner_output_to_dict(output)} if rank == 0 else {"op": "done"}
        conn.send_bytes(dumps(reply))


def run_worker(
    rank: int, world_size: int, args_json: str, init_method: str, conn: Connection, parent_pid: int
) -> None:
    """Process target (spawned): runs until shutdown; exit code 1 after reporting an error."""
    os.environ["NCCL_NVLS_ENABLE"] = "0"  # NVLink multicast: off on every machine we run
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    exit_with_parent(parent_pid, "engine-parent-watchdog")
    worker: Any = None
    try:
        from engine.config import EngineArgs
        from engine.model_executor.worker import Worker

        args = EngineArgs(**json.loads(args_json))
        worker = Worker(args, rank, world_size, init_method)
        conn.send_bytes(dumps({"op": "ready", **worker.info()}))
        _serve(worker, conn, rank)
    except BaseException as exc:
        _report(conn, rank, exc, started=worker is not None)
        # Skip interpreter teardown: communicator destructors can block on dead peers.
        os._exit(1)
    worker.close()
