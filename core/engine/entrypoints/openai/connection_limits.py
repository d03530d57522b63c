"""Connection-level limits of the HTTP server: a deadline for the request head, a cap on
open connections, and a quiet log when the process runs out of file descriptors.

uvicorn times out idle keep-alive connections but gives a new connection forever to send
its request line and headers, so a few hundred slow clients ("slowloris") hold sockets
indefinitely, and with enough of them the file descriptors run out: ``/health`` stops
answering and asyncio logs ``socket.accept() out of system resource`` thousands of times a
second. ``guarded_h11`` returns uvicorn's h11 protocol with two additions:

- ``--http-header-timeout``: a connection whose complete request head has not arrived this
  many seconds after it opened (or after its previous response) is closed.
- ``--max-connections``: a connection over the cap is answered ``503`` and closed at once,
  so the file descriptors left keep ``/health`` and the admitted clients working.

``raise_fd_limit`` lifts the soft ``RLIMIT_NOFILE`` toward the cap (the default soft limit
is often 1024), and ``AcceptErrorFilter`` lets one "out of system resource" line through
per ``interval_s`` with the count of those it held back.
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Any

import h11
from uvicorn.protocols.http.h11_impl import H11Protocol

logger = logging.getLogger("engine.server")
# File descriptors kept free beyond the connections: the engine pipes, logs, model files.
FD_HEADROOM = 256
_BUSY = (
    b"HTTP/1.1 503 Service Unavailable\r\ncontent-type: application/json\r\n"
    b"connection: close\r\ncontent-length: %d\r\n\r\n%s"
)
_BUSY_BODY = (
    b'{"error": {"message": "The server has too many open connections (--max-connections); '
    b'retry later.", "type": "service_unavailable", "param": null, "code": 503}}'
)


def guarded_h11(header_timeout_s: float, max_connections: int) -> type[H11Protocol]:
    """uvicorn's h11 protocol with a request-head deadline and a connection cap."""
    refusals = RefusalLog()

    class GuardedH11Protocol(H11Protocol):
        _head_timer: asyncio.TimerHandle | None = None

        def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
            super().connection_made(transport)
            if len(self.connections) > max_connections:
                refusals.note(len(self.connections) - 1)
                transport.write(_BUSY % (len(_BUSY_BODY), _BUSY_BODY))
                transport.close()
                return
            self._arm_head_timer()

        def data_received(self, data: bytes) -> None:
            super().data_received(data)
            if self.conn.their_state is not h11.IDLE:
                self._cancel_head_timer()

        def on_response_complete(self) -> None:
            super().on_response_complete()
            if not self.transport.is_closing() and self.conn.their_state is h11.IDLE:
                self._arm_head_timer()

        def connection_lost(self, exc: Exception | None) -> None:
            self._cancel_head_timer()
            super().connection_lost(exc)

        def _arm_head_timer(self) -> None:
            self._cancel_head_timer()
            if header_timeout_s > 0:
                self._head_timer = self.loop.call_later(header_timeout_s, self._head_timed_out)

        def _cancel_head_timer(self) -> None:
            if self._head_timer is not None:
                self._head_timer.cancel()
                self._head_timer = None

        def _head_timed_out(self) -> None:
            self._head_timer = None
            if self.conn.their_state is h11.IDLE and not self.transport.is_closing():
                self.transport.close()

    return GuardedH11Protocol


class RefusalLog:
    """One warning per ``interval_s`` while connections are refused, with how many were."""

    def __init__(self, interval_s: float = 10.0) -> None:
        self.interval_s = interval_s
        self._last = float("-inf")
        self._count = 0

    def note(self, num_open: int) -> None:
        self._count += 1
        now = time.monotonic()
        if now - self._last >= self.interval_s:
            logger.warning(
                "Refused %d connection(s) since the last such warning: %d are open, the "
                "limit of --max-connections.",
                self._count,
                num_open,
            )
            self._last = now
            self._count = 0


def raise_fd_limit(max_connections: int) -> int:
    """Lift the soft file-descriptor limit to fit ``max_connections`` (up to the hard
    limit); the number of connections the limit then allows."""
    try:
        import resource
    except ImportError:  # not POSIX
        return max_connections
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    wanted = max_connections + FD_HEADROOM
    if soft != resource.RLIM_INFINITY and soft < wanted:
        new_soft = wanted if hard == resource.RLIM_INFINITY else min(wanted, hard)
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (new_soft, hard))
            soft = new_soft
        except (ValueError, OSError):
            pass
    if soft == resource.RLIM_INFINITY or soft >= wanted:
        return max_connections
    allowed = max(soft - FD_HEADROOM, 1)
    logger.warning(
        "--max-connections %d does not fit the file-descriptor limit (%d, hard %s); "
        "connections are capped at %d. Raise the limit (ulimit -n) to allow more.",
        max_connections, soft, hard, allowed,
    )  # fmt: skip
    return allowed


class AcceptErrorFilter(logging.Filter):
    """Rate-limits asyncio's "socket.accept() out of system resource" error: one record per
    ``interval_s``, annotated with the number held back since the last one."""

    def __init__(self, interval_s: float = 10.0) -> None:
        super().__init__()
        self.interval_s = interval_s
        self._last = float("-inf")
        self._held_back = 0

    def filter(self, record: logging.LogRecord) -> bool:
        if "out of system resource" not in str(record.msg):
            return True
        now = time.monotonic()
        if now - self._last < self.interval_s:
            self._held_back += 1
            return False
        self._last = now
        record.msg = (
            f"{record.msg} (file descriptors exhausted: lower --max-connections or raise "
            f"ulimit -n; {self._held_back} similar lines held back)"
        )
        record.exc_info = None
        record.exc_text = None
        self._held_back = 0
        return True


def install_accept_error_filter(interval_s: float = 10.0) -> AcceptErrorFilter:
    log = logging.getLogger("asyncio")
    for existing in log.filters:
        if isinstance(existing, AcceptErrorFilter):
            return existing
    log_filter = AcceptErrorFilter(interval_s)
    log.addFilter(log_filter)
    return log_filter


def uvicorn_connection_options(
    header_timeout_s: float, keep_alive_timeout_s: float, max_connections: int
) -> dict[str, Any]:
    """The ``uvicorn.Config`` keywords for these limits (the protocol class among them)."""
    allowed = raise_fd_limit(max_connections)
    install_accept_error_filter()
    return {
        "http": guarded_h11(header_timeout_s, allowed),
        "timeout_keep_alive": max(1, round(keep_alive_timeout_s)),
    }
