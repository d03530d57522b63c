"""Tensor parallelism across nodes: ``--nnodes``, ``--node-rank``, ``--master-addr``,
``--master-port`` (vLLM's names), with ``--headless`` on the nodes that serve no HTTP.

    node 0: engine serve --nnodes 2 --node-rank 0          node 1: engine serve --headless
                                                                    --nnodes 2 --node-rank 1
    Scheduler ─ MultiprocExecutor ─ pipe ─ rank 0 ──┐       ┌── rank 1 (spawned worker)
                     │                               collectives: torch.distributed,
                     │                               rendezvous tcp://master-addr:master-port
                     └─ TCP master-addr:master-port+1 ◄─────┘ step inputs / outputs (JSON)

Node r runs ranks ``r*k .. r*k+k-1`` with ``k = tensor_parallel_size / nnodes``, on its
local GPUs ``0 .. k-1``. The scheduler stays on node 0. A remote rank receives the same
JSON step messages as a local one (``worker_main``), over a TCP connection instead of a
pipe. When ``ENGINE_MULTINODE_KEY`` is set on every node, each connection first passes an
HMAC challenge with it. Messages are JSON, never pickle. Either way, keep these ports on
a private network.

A remote worker that dies or disconnects fails the engine as a local one does
(``WorkerFailedError`` naming the rank). The engine's shutdown stops the remote workers,
and the headless node exits once they have.
"""

from __future__ import annotations

import json
import logging
import multiprocessing
import multiprocessing.connection
import os
import signal
import socket
import time
from dataclasses import asdict
from multiprocessing.connection import Connection
from typing import Any

from engine.config import EngineArgs
from engine.errors import StartupError
from engine.executor.step_codec import dumps, loads
from engine.executor.worker_main import run_worker

logger = logging.getLogger(__name__)

CONNECT_TIMEOUT_S = 1800.0  # the other nodes may start much later (image pulls, scheduling)
_KEY_ENV = "ENGINE_MULTINODE_KEY"


def check_multinode(args: EngineArgs) -> None:
    """The node flags fit together (a no-op for one node)."""
    if args.nnodes < 1:
        raise StartupError(f"--nnodes must be at least 1, got {args.nnodes}")
    if not 0 <= args.node_rank < args.nnodes:
        raise StartupError(
            f"--node-rank {args.node_rank} is outside 0..{args.nnodes - 1} (--nnodes {args.nnodes})"
        )
    if args.nnodes > 1 and args.tensor_parallel_size % args.nnodes:
        raise StartupError(
            f"--tensor-parallel-size {args.tensor_parallel_size} does not split over "
            f"--nnodes {args.nnodes}: use a multiple of {args.nnodes} (the same number of "
            "ranks on every node)"
        )
    if not 0 < args.master_port < 65535:
        raise StartupError(f"--master-port must be in 1..65534, got {args.master_port}")


def ranks_per_node(args: EngineArgs) -> int:
    return max(1, args.tensor_parallel_size // max(1, args.nnodes))


def node_ranks(args: EngineArgs) -> list[int]:
    """The global ranks this node runs."""
    k = ranks_per_node(args)
    return list(range(args.node_rank * k, (args.node_rank + 1) * k))


def init_method(args: EngineArgs) -> str:
    return f"tcp://{args.master_addr}:{args.master_port}"


def _authkey() -> bytes | None:
    key = os.environ.get(_KEY_ENV)
    return key.encode() if key else None


# -- node 0: accept the other nodes' ranks --------------------------------------------------


def accept_remote_ranks(
    args: EngineArgs, ranks: list[int], timeout: float = CONNECT_TIMEOUT_S
) -> dict[int, Connection]:
    """Wait until every rank in ``ranks`` has connected its step channel."""
    address = (args.master_addr, args.master_port + 1)
    server = socket.create_server(address, reuse_port=False)
    server.settimeout(1.0)
    conns: dict[int, Connection] = {}
    deadline = time.monotonic() + timeout
    logger.info("waiting for ranks %s of the other nodes on %s:%d", ranks, *address)
    try:
        while len(conns) < len(ranks):
            if time.monotonic() > deadline:
                missing = sorted(set(ranks) - set(conns))
                raise StartupError(
                    f"tensor-parallel ranks {missing} did not connect to "
                    f"{address[0]}:{address[1]} within {timeout:g} s: start engine serve "
                    "--headless on the other nodes with the same --nnodes, --master-addr and "
                    "--master-port, and check that they can reach that address"
                )
            try:
                sock, _ = server.accept()
            except TimeoutError:
                continue
            sock.settimeout(None)
            conn = Connection(sock.detach())
            rank = _greet(conn, ranks, conns)
            if rank is None:
                conn.close()
            else:
                conns[rank] = conn
    except BaseException:
        for conn in conns.values():
            conn.close()
        raise
    finally:
        server.close()
    return conns


def _greet(conn: Connection, ranks: list[int], taken: dict[int, Connection]) -> int | None:
    try:
        key = _authkey()
        if key is not None:
            multiprocessing.connection.deliver_challenge(conn, key)  # type: ignore[attr-defined]
        if not conn.poll(30.0):
            return None
        hello = loads(conn.recv_bytes(4096))
    except (OSError, EOFError, ValueError, multiprocessing.AuthenticationError) as exc:
        logger.warning("refused a connection on the step port: %s", exc)
        return None
    if not isinstance(hello, dict) or hello.get("op") != "hello":
        logger.warning("refused a step connection with greeting %r", hello)
        return None
    rank = hello.get("rank")
    if rank not in ranks or rank in taken:
        logger.warning("refused a step connection with greeting %r", hello)
        return None
    return int(rank)


class RemoteProcess:
    """Stands in for a remote rank's process in ``MultiprocExecutor``: no pid, no sentinel;
    its death shows as the connection's end of file."""

    pid = None
    sentinel = None
    exitcode = None

    def __init__(self, conn: Connection) -> None:
        self.conn = conn

    def is_alive(self) -> bool:
        return not self.conn.closed

    def join(self, timeout: float | None = None) -> None:
        return None

    def terminate(self) -> None:
        self.conn.close()

    kill = terminate


# -- the other nodes: run the local ranks, connect them to node 0 -----------------------------


def connect_to_master(
    args: EngineArgs, rank: int, timeout: float = CONNECT_TIMEOUT_S
) -> Connection:
    address = (args.master_addr, args.master_port + 1)
    deadline = time.monotonic() + timeout
    while True:
        try:
            sock = socket.create_connection(address, timeout=5.0)
            break
        except OSError:
            if time.monotonic() > deadline:
                raise StartupError(
                    f"rank {rank} could not reach node 0 at {address[0]}:{address[1]} within "
                    f"{timeout:g} s (is engine serve --node-rank 0 running there?)"
                ) from None
            time.sleep(1.0)
    sock.settimeout(None)
    conn = Connection(sock.detach())
    key = _authkey()
    if key is not None:
        multiprocessing.connection.answer_challenge(conn, key)  # type: ignore[attr-defined]
    conn.send_bytes(dumps({"op": "hello", "rank": rank}))
    return conn


def run_remote_worker(
    rank: int, world_size: int, args_json: str, method: str, parent_pid: int
) -> None:
    """Process target on a headless node: connect the step channel, then serve steps."""
    args = EngineArgs(**json.loads(args_json))
    conn = connect_to_master(args, rank)
    run_worker(rank, world_size, args_json, method, conn, parent_pid)


def run_headless(args: EngineArgs) -> int:
    """``engine serve --headless``: this node's ranks until node 0 stops them; the exit
    code (0 after a normal shutdown, 1 when a rank failed)."""
    check_multinode(args)
    if args.node_rank == 0:
        raise StartupError(
            "--headless runs the ranks of another node: give it --node-rank 1 or more (node 0 "
            "runs engine serve without --headless)"
        )
    ctx = multiprocessing.get_context("spawn")
    args_json = json.dumps(asdict(args))
    ranks = node_ranks(args)
    procs = [
        ctx.Process(
            target=run_remote_worker,
            args=(rank, args.tensor_parallel_size, args_json, init_method(args), os.getpid()),
            name=f"EngineWorker-TP{rank}",
            daemon=True,
        )
        for rank in ranks
    ]
    for proc in procs:
        proc.start()
    logger.info(
        "headless node %d: ranks %s, connecting to %s:%d",
        args.node_rank, ranks, args.master_addr, args.master_port,
    )  # fmt: skip

    def stop(signum: int, frame: Any) -> None:
        for proc in procs:
            if proc.is_alive():
                proc.terminate()

    previous = {sig: signal.signal(sig, stop) for sig in (signal.SIGTERM, signal.SIGINT)}
    try:
        for proc in procs:
            proc.join()
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    codes = [proc.exitcode for proc in procs]
    logger.info("headless node %d: ranks exited with %s", args.node_rank, codes)
    return 0 if all(code in (0, -signal.SIGTERM) for code in codes) else 1


__all__ = [
    "RemoteProcess",
    "accept_remote_ranks",
    "check_multinode",
    "connect_to_master",
    "init_method",
    "node_ranks",
    "ranks_per_node",
    "run_headless",
]
