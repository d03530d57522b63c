"""``--api-server-count N``: N HTTP front-end processes over one engine process.

    engine serve (supervisor)   binds the port, starts the engine, then the API servers
      ├─ engine-core            one LLMEngine, one pipe per API server (engine_process.py)
      ├─ api-server-0 ┐         uvicorn on its own socket bound to the port with
      └─ api-server-1 ┘         SO_REUSEPORT (the kernel spreads new connections evenly)
                                + ProcessAsyncLLM over its own pipe

Under many concurrent streams the server's Python work (parsing, tokenizing, rebuilding
outputs, SSE chunks) saturates one core before the GPU is busy; each API server brings its
own interpreter. Every API server receives all engine stats, so ``/metrics`` and the stats
line describe the whole engine whichever process answers; only API server 0 logs the
periodic stats line.

Lifecycle: SIGTERM or Ctrl-C reaches the supervisor, which forwards SIGTERM to each API
server (a second signal: forwarded again, they abort at once); each drains as a single
server does and says "stop" to the engine process, which exits once no API server is left.
If any API server or the engine process dies, the others are stopped and ``engine serve``
exits 1, so an orchestrator restarts the whole server.

``--data-parallel-size N`` starts N engine processes (each on its own GPUs, started in
parallel) and gives every API server one pipe to each; the API server balances its
requests over them (``engine/data_parallel.py``).
"""

from __future__ import annotations

import dataclasses
import logging
import multiprocessing
import multiprocessing.connection
import os
import signal
import socket
import sys
from typing import Any

from engine.config import EngineArgs
from engine.data_parallel import DataParallelAsyncLLM, device_groups
from engine.engine_process import (
    EngineReady,
    ProcessAsyncLLM,
    kill_engine_process,
    spawn_engine_process,
    wait_engine_ready,
)
from engine.errors import EngineError
from engine.log_setup import configure_logging
from engine.parent_watch import exit_with_parent
from engine.server_config import ServerArgs

logger = logging.getLogger("engine.server")

_ENGINE_EXIT_TIMEOUT_S = 10.0


def bind_sockets(host: str, port: int, count: int) -> list[socket.socket]:
    """One socket per API server, all bound to ``host:port`` with SO_REUSEPORT: the kernel
    spreads new connections evenly over those listening (asyncio calls listen when a
    server starts). Port 0 picks a free port for all of them."""
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    except socket.gaierror as exc:
        raise EngineError(f"--host {host!r} cannot be resolved: {exc}") from None
    family, kind, proto, _, address = infos[0]
    sockets: list[socket.socket] = []
    try:
        for _ in range(count):
            sock = socket.socket(family, kind, proto)
            sockets.append(sock)
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
            sock.bind(address)
            address = sock.getsockname()  # the port picked for port 0
    except OSError as exc:
        for sock in sockets:
            sock.close()
        raise EngineError(
            f"cannot listen on {host}:{port}: {exc.strerror} (choose another --port or --host)"
        ) from None
    return sockets


def run_api_servers(engine_args: EngineArgs, server_args: ServerArgs) -> None:
    """Serve with ``server_args.api_server_count`` API server processes over
    ``--data-parallel-size`` engine processes until a signal."""
    count = server_args.api_server_count or 1
    num_engines = server_args.data_parallel_size
    envs = engine_envs(engine_args, num_engines)
    sockets = bind_sockets(server_args.host, server_args.port, count)
    engines: list[tuple[Any, list[Any]]] = []
    try:
        for rank, env in enumerate(envs):
            name = "engine-core" if num_engines == 1 else f"engine-core-{rank}"
            engines.append(spawn_engine_process(engine_args, count, env, name))
        readies = [wait_engine_ready(proc, conns) for proc, conns in engines]
    except BaseException:
        for proc, _ in engines:
            kill_engine_process(proc)
        for sock in sockets:
            sock.close()
        raise
    engine_procs = [proc for proc, _ in engines]
    ctx = multiprocessing.get_context("spawn")
    level = logging.getLogger().getEffectiveLevel()
    servers = []
    try:
        for index, sock in enumerate(sockets):
            conns = [engine_conns[index] for _, engine_conns in engines]
            args = (index, conns, readies, sock, engine_args, server_args, level, os.getpid())
            proc = ctx.Process(target=api_server_main, args=args, name=f"api-server-{index}")
            proc.start()
            for conn in conns:
                conn.close()  # the API server holds its ends now
            sock.close()
            servers.append(proc)
        logger.info(
            "Started %d API server process(es) over %d engine process(es).", count, num_engines
        )
        failure = _supervise(servers, engine_procs)
    finally:
        for proc in servers:
            if proc.is_alive():
                proc.kill()
            proc.join(5)
        for engine_proc in engine_procs:
            engine_proc.join(_ENGINE_EXIT_TIMEOUT_S)
            kill_engine_process(engine_proc)
    if failure is not None:
        raise EngineError(failure)


def engine_envs(engine_args: EngineArgs, num_engines: int) -> list[dict[str, str]]:
    """Each engine process's environment: its own GPUs under ``--data-parallel-size``."""
    if num_engines == 1:
        return [{}]
    if engine_args.nnodes > 1:
        raise EngineError(
            f"--data-parallel-size {num_engines} with --nnodes {engine_args.nnodes} is not "
            "supported: run one tensor-parallel group per set of nodes (one replica each)"
        )
    device, visible = engine_args.device, []
    if device != "cpu":
        listed = os.environ.get("CUDA_VISIBLE_DEVICES")
        if listed is not None:
            visible = [d.strip() for d in listed.split(",") if d.strip()]
        else:
            import torch

            visible = [str(i) for i in range(torch.cuda.device_count())]
        if device == "auto" and not visible:
            device = "cpu"
    try:
        return device_groups(num_engines, engine_args.tensor_parallel_size, device, visible)
    except ValueError as exc:
        raise EngineError(str(exc)) from None


def _supervise(servers: list[Any], engine_procs: list[Any]) -> str | None:
    """Wait until every API server has exited; forward signals; on a death, stop the rest.
    Returns why the server failed, or None after a requested shutdown."""
    signals = 0
    failure: str | None = None

    def stop_servers() -> None:
        for proc in servers:
            if proc.exitcode is None:
                try:
                    os.kill(proc.pid, signal.SIGTERM)
                except ProcessLookupError:
                    pass

    def on_signal(signum: int, frame: Any) -> None:
        nonlocal signals
        signals += 1
        stop_servers()

    previous = {sig: signal.signal(sig, on_signal) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        while any(proc.exitcode is None for proc in servers):
            sentinels = [p.sentinel for p in servers if p.exitcode is None]
            if failure is None:
                sentinels += [p.sentinel for p in engine_procs]
            multiprocessing.connection.wait(sentinels, timeout=0.5)
            if failure is not None or signals:
                continue
            failure = _first_failure(servers, engine_procs)
            if failure is not None:
                logger.error("%s; stopping the server", failure)
                stop_servers()
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    if failure is None:
        failure = next(
            (f"API server {i} exited with code {p.exitcode}"
             for i, p in enumerate(servers) if p.exitcode not in (0, -signal.SIGTERM)),
            None,
        )  # fmt: skip
    return failure


def _first_failure(servers: list[Any], engine_procs: list[Any]) -> str | None:
    for index, proc in enumerate(servers):
        if proc.exitcode is not None:
            return f"API server {index} exited unexpectedly (exit code {proc.exitcode})"
    for rank, proc in enumerate(engine_procs):
        if proc.exitcode is not None:
            which = "the engine process" if len(engine_procs) == 1 else f"engine process {rank}"
            return f"{which} exited unexpectedly (exit code {proc.exitcode})"
    return None


def api_server_main(
    index: int,
    conns: list[Any],
    readies: list[EngineReady],
    sock: socket.socket,
    engine_args: EngineArgs,
    server_args: ServerArgs,
    log_level: int,
    parent_pid: int,
) -> None:
    """Entry point of one API server process."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the supervisor forwards Ctrl-C
    configure_logging(log_level, f"[{index}]")
    exit_with_parent(parent_pid, "parent-watch")
    from engine.entrypoints.openai.chat_features import load_chat_features
    from engine.entrypoints.openai.server import _GIL_SWITCH_INTERVAL_S, serve_engine

    if index > 0:  # one periodic stats line for the whole server
        server_args = dataclasses.replace(server_args, log_stats_interval=0.0)
    sys.setswitchinterval(_GIL_SWITCH_INTERVAL_S)
    try:
        features = load_chat_features(engine_args, server_args)
        clients = [ProcessAsyncLLM(engine_args, c, r) for c, r in zip(conns, readies, strict=True)]
        engine_client: Any = clients[0] if len(clients) == 1 else DataParallelAsyncLLM(clients)
        serve_engine(engine_client, engine_args, server_args, features, [sock], index)
    except EngineError as exc:
        logger.error("%s", exc)
        sys.exit(1)


__all__ = ["api_server_main", "bind_sockets", "run_api_servers"]
