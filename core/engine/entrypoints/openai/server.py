"""Run the app under uvicorn: startup line, SIGTERM drain, engine shutdown.

On the first SIGTERM (or Ctrl-C) the server answers new requests with 503, waits up to
``--shutdown-timeout`` seconds for in-flight requests, aborts the rest (they end with
``finish_reason: "abort"``) and exits 0. A second Ctrl-C aborts at once.

A watchdog ends the server (exit code 1) when the engine loop has had work pending and made
no progress for ``--watchdog-timeout`` seconds, so an orchestrator restarts it; requests in
flight get an error first. The same happens within a second when the engine dies (its
process killed, its loop crashed), and when the idle engine process has sent no heartbeat
for ``--engine-heartbeat-timeout`` seconds (stopped or wedged); the log says which.

HTTP parsing is h11's, whose incomplete-event limit bounds the request line plus headers
(``--max-header-bytes``); httptools has no such bound. ``connection_limits`` adds the
request-head deadline and the connection cap.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import signal
import socket
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import uvicorn

from engine.config import EngineArgs
from engine.engine_client import EngineClient
from engine.entrypoints.openai.api_server import build_app, describe_config
from engine.entrypoints.openai.chat_features import load_chat_features
from engine.entrypoints.openai.connection_limits import uvicorn_connection_options
from engine.entrypoints.openai.metrics import ServerMetrics
from engine.entrypoints.openai.serving_base import ServingContext
from engine.errors import EngineError
from engine.lora.registry import build_lora_registry
from engine.server_config import ServerArgs, resolve_api_server_count

logger = logging.getLogger("engine.server")
_ABORT_GRACE_S = 5.0
_GIL_SWITCH_INTERVAL_S = 0.0005
_MONITOR_POLL_S = 0.5


def engine_failure(engine_client: EngineClient, heartbeat_timeout: float) -> str | None:
    """Why the engine can serve no more requests (dead, or silent while idle), or None."""
    dead = engine_client.dead_error
    if dead is not None:
        return f"the engine stopped: {dead}"
    if heartbeat_timeout > 0:
        silent_s = engine_client.silent_for()
        if silent_s > heartbeat_timeout:
            return (
                f"the idle engine process has sent no heartbeat for {silent_s:.0f} s "
                f"(--engine-heartbeat-timeout {heartbeat_timeout:g}): it is stopped or wedged"
            )
    return None


class EngineServer(uvicorn.Server):
    def __init__(
        self,
        config: uvicorn.Config,
        ctx: ServingContext,
        shutdown_timeout: float,
        watchdog_timeout: float = 0.0,
        heartbeat_timeout: float = 0.0,
    ) -> None:
        super().__init__(config)
        self.ctx = ctx
        self.shutdown_timeout = shutdown_timeout
        self.watchdog_timeout = watchdog_timeout
        self.heartbeat_timeout = heartbeat_timeout
        self._monitor_task: asyncio.Task[None] | None = None
        self.watchdog_fired: str | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._drain_task: asyncio.Task[None] | None = None
        self._watchdog_task: asyncio.Task[None] | None = None
        self._signals = 0
        self.api_server_index: int | None = None  # set when one of several API servers

    async def startup(self, sockets: list[socket.socket] | None = None) -> None:
        self._loop = asyncio.get_running_loop()
        await super().startup(sockets)
        if self.started and self.watchdog_timeout > 0:
            self._watchdog_task = asyncio.ensure_future(self._watchdog())
        if self.started:
            self._monitor_task = asyncio.ensure_future(self._engine_monitor())
        if self.started:
            cfg = self.config
            scheme = "https" if cfg.ssl_certfile else "http"
            host = f"[{cfg.host}]" if ":" in cfg.host else cfg.host
            port = self.servers[0].sockets[0].getsockname()[1] if self.servers else cfg.port
            index = self.api_server_index
            where = "Engine ready" if index is None else f"API server {index} ready"
            logger.info("%s at %s://%s:%s", where, scheme, host, port)

    def handle_exit(self, sig: int, frame: Any) -> None:
        # Not recorded in _captured_signals: uvicorn would re-raise it and exit with -15.
        if self.api_server_index is not None and sig == signal.SIGINT:
            return  # Ctrl-C reaches the whole process group; the supervisor forwards it
        self._signals += 1
        if self._loop is None:  # before startup finished: stop plainly
            self.should_exit = True
            return
        immediate = self._signals > 1
        self._loop.call_soon_threadsafe(self._start_drain, immediate)

    def _start_drain(self, immediate: bool) -> None:
        self.ctx.inflight.draining = True
        if immediate:
            logger.warning("Second signal: aborting %d request(s) now.", len(self.ctx.inflight))
            asyncio.ensure_future(self._abort_and_exit())
        elif self._drain_task is None:
            self._drain_task = asyncio.ensure_future(self._drain())

    async def _watchdog(self) -> None:
        """Exit non-zero once the engine loop is wedged (pending work, no progress)."""
        poll_s = min(1.0, self.watchdog_timeout / 4)
        while not self.should_exit:
            await asyncio.sleep(poll_s)
            stalled_s = self.ctx.engine.stalled_for()
            if stalled_s <= self.watchdog_timeout or self.watchdog_fired is not None:
                continue
            self.watchdog_fired = (
                f"watchdog: the engine loop made no progress for {stalled_s:.0f} s with "
                f"requests pending (--watchdog-timeout {self.watchdog_timeout:g}); exiting so "
                "the server can be restarted"
            )
            await self._exit_for_engine(self.watchdog_fired)
            return

    async def _engine_monitor(self) -> None:
        """Exit non-zero once the engine is dead or its idle process has gone silent."""
        while not self.should_exit:
            await asyncio.sleep(_MONITOR_POLL_S)
            reason = engine_failure(self.ctx.engine, self.heartbeat_timeout)
            if reason and not self.should_exit and self.watchdog_fired is None:
                self.watchdog_fired = f"{reason}; exiting so the server can be restarted"
                await self._exit_for_engine(self.watchdog_fired)
                return

    async def _exit_for_engine(self, reason: str) -> None:
        logger.error("%s", reason)
        self.ctx.inflight.draining = True
        self.ctx.engine.declare_dead(reason)
        await asyncio.sleep(0.5)  # let the failed streams send their error chunks
        self.should_exit = True

    async def _drain(self) -> None:
        inflight = self.ctx.inflight
        logger.info(
            "Shutting down: no new requests; waiting up to %.0f s for %d in-flight request(s).",
            self.shutdown_timeout,
            len(inflight),
        )
        deadline = time.monotonic() + self.shutdown_timeout
        while len(inflight) and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
        await self._abort_and_exit()

    async def _abort_and_exit(self) -> None:
        inflight = self.ctx.inflight
        if len(inflight):
            logger.warning(
                "Shutdown timeout reached: aborting %d request(s) (finish_reason 'abort').",
                len(inflight),
            )
            await inflight.abort_all()
            deadline = time.monotonic() + _ABORT_GRACE_S
            while len(inflight) and time.monotonic() < deadline:
                await asyncio.sleep(0.05)
        self.should_exit = True


def default_served_name(model: str | None) -> str:
    """The short name of a model path: the folder's base name (a GGUF file's stem)."""
    from engine.server_config import DEFAULT_MODEL_NAME

    if not model:
        return DEFAULT_MODEL_NAME
    path = Path(model.rstrip("/"))
    return path.stem if path.suffix.lower() == ".gguf" else path.name


def default_served_names(model: str | None) -> list[str]:
    """Names served without ``--served-model-name``: the ``--model`` argument as given (as
    vLLM does, so a client that sends the path it started the server with is answered),
    then the short name as an alias when it differs."""
    short = default_served_name(model)
    if not model or model == short:
        return [short]
    return [model, short]


def attach_stats_listener(engine_client: EngineClient, metrics: ServerMetrics) -> bool:
    """Feed the engine's per-step ``IterationStats`` into the metrics; an engine that
    reports none (a test fake) leaves the token and latency metrics to the HTTP layer."""
    reports = engine_client.add_stats_listener(metrics.observe_iteration)
    metrics.engine_reports_iterations = reports
    return reports


def run_server(
    engine_args: EngineArgs,
    server_args: ServerArgs,
    engine_factory: Callable[[EngineArgs], Any] | None = None,
) -> None:
    """Start the engine, serve until a signal, drain, shut the engine down."""
    if engine_factory is None:
        count = resolve_api_server_count(server_args, engine_args.device)
    elif (server_args.api_server_count or 1) > 1 or server_args.data_parallel_size > 1:
        raise EngineError("--api-server-count > 1 and --data-parallel-size > 1 start engines")
    else:
        count = 1
    server_args = dataclasses.replace(server_args, api_server_count=count)
    logger.info("Resolved configuration:\n%s", describe_config(engine_args, server_args))
    # Parser flags are checked before the (slow) engine start; a bad one exits non-zero.
    features = load_chat_features(engine_args, server_args)
    if count > 1 or server_args.data_parallel_size > 1:
        from engine.entrypoints.openai.api_servers import run_api_servers

        run_api_servers(engine_args, server_args)
        return
    if engine_factory is None:
        from engine.async_llm import AsyncLLM
        from engine.engine_process import ProcessAsyncLLM

        engine_factory = (
            ProcessAsyncLLM.from_args if server_args.engine_process else AsyncLLM.from_args
        )
    # The engine thread drops the GIL while it waits for the GPU; when the wait ends it
    # needs the GIL back from the event loop, which Python hands over only every switch
    # interval (5 ms by default: longer than a whole decode step). 0.5 ms keeps the GPU fed.
    sys.setswitchinterval(_GIL_SWITCH_INTERVAL_S)
    serve_engine(engine_factory(engine_args), engine_args, server_args, features)


def serve_engine(
    engine_client: Any,
    engine_args: EngineArgs,
    server_args: ServerArgs,
    features: Any,
    sockets: list[socket.socket] | None = None,
    api_server_index: int | None = None,
) -> None:
    """Serve ``engine_client`` over HTTP until a signal (or the watchdog), then shut it down.

    ``sockets``: this API server's socket, already bound to the port it shares with the
    other API server processes (``api_server_index`` says which one this is; it ignores
    SIGINT, which its supervisor forwards as SIGTERM)."""
    server: EngineServer | None = None
    try:
        names = server_args.served_model_name or default_served_names(engine_args.model)
        ctx = ServingContext(
            engine=engine_client,
            served_model_names=list(names),
            metrics=ServerMetrics(names[0], lambda: engine_client.stats()),
            log_requests=server_args.enable_log_requests,
            max_logprobs=engine_args.max_logprobs,
            features=features,
            lora=build_lora_registry(engine_args, server_args, list(names)),
        )
        attach_stats_listener(engine_client, ctx.metrics)
        if server_args.metrics_compat == "vllm":
            from engine.entrypoints.openai.metrics_vllm import vllm_compat_registry

            ctx.metrics.extra_registries.append(
                vllm_compat_registry(ctx.metrics.registry, engine_client.stats, engine_args)
            )
        app = build_app(ctx, server_args)
        config = uvicorn.Config(
            app,
            host=server_args.host,
            port=server_args.port,
            log_config=None,
            log_level=server_args.log_level,
            access_log=server_args.enable_log_requests,
            ssl_keyfile=server_args.ssl_keyfile,
            ssl_certfile=server_args.ssl_certfile,
            h11_max_incomplete_event_size=server_args.max_header_bytes,
            timeout_graceful_shutdown=int(_ABORT_GRACE_S),
            lifespan="on",
            **uvicorn_connection_options(
                server_args.http_header_timeout,
                server_args.http_keep_alive_timeout,
                server_args.max_connections,
            ),
        )
        server = EngineServer(
            config, ctx, server_args.shutdown_timeout, server_args.watchdog_timeout,
            server_args.engine_heartbeat_timeout,
        )  # fmt: skip
        server.api_server_index = api_server_index
        server.run(sockets=sockets)
        if server.watchdog_fired:
            raise EngineError(server.watchdog_fired)
    finally:
        if server is not None and server.watchdog_fired:
            engine_client.shutdown(timeout=1.0)  # the loop is wedged: do not wait long
        else:
            engine_client.shutdown()
        logger.info("Engine stopped." if api_server_index is None else "API server stopped.")
