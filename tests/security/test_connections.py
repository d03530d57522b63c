"""Connection limits of a real ``engine serve`` (issue 17 item 7): a slow request head is
cut off after ``--http-header-timeout``; connections over ``--max-connections`` get a 503
and are closed, while ``/health`` and admitted clients keep working."""

from __future__ import annotations

import logging
import socket
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from engine.entrypoints.openai.connection_limits import AcceptErrorFilter
from sec_helpers import Server, free_port, good_request, serve_cmd

pytestmark = pytest.mark.timeout(300)
MAX_CONNECTIONS = 8


@pytest.fixture(scope="module")
def limited_server(tiny_model: Path) -> Iterator[Server]:
    port = free_port()
    cmd = serve_cmd(
        tiny_model, port, "--http-header-timeout", "1.5", "--max-connections",
        str(MAX_CONNECTIONS),
    )  # fmt: skip
    server = Server(cmd, port).start()
    yield server
    server.stop()


def _closed_within(sock: socket.socket, timeout: float) -> tuple[bool, bytes]:
    """Whether the server closes ``sock`` within ``timeout`` s, and what it sent."""
    sock.settimeout(0.2)
    deadline = time.monotonic() + timeout
    data = b""
    while time.monotonic() < deadline:
        try:
            chunk = sock.recv(4096)
        except TimeoutError:
            continue
        except ConnectionResetError:
            return True, data
        if not chunk:
            return True, data
        data += chunk
    return False, data


def test_slow_request_head_is_cut_off(limited_server: Server) -> None:
    with socket.create_connection(("127.0.0.1", limited_server.port)) as sock:
        sock.sendall(b"GET /v1/models HTTP/1.1\r\nHost: x\r\n")  # never finishes the head
        start = time.monotonic()
        closed = False
        while not closed and time.monotonic() - start < 6:
            try:
                sock.sendall(b"X-Slow: 1\r\n")  # a header every half second (slowloris)
            except OSError:
                closed = True
                break
            closed, _ = _closed_within(sock, 0.5)
        assert closed, "the server kept a connection with an unfinished head open"
        assert time.monotonic() - start < 5
    good_request(limited_server)


def test_connections_over_the_cap_are_refused(limited_server: Server) -> None:
    socks = [socket.create_connection(("127.0.0.1", limited_server.port)) for _ in range(12)]
    try:
        time.sleep(0.5)  # under the head timeout: only the refused ones are closed yet
        answers = []
        for sock in socks:
            sock.setblocking(False)
            try:
                answers.append(sock.recv(4096))
            except BlockingIOError:
                answers.append(None)  # open, nothing sent: admitted
        refused = [a for a in answers if a is not None]
        assert len(refused) >= 12 - MAX_CONNECTIONS, answers
        assert all(d.startswith(b"HTTP/1.1 503") for d in refused), refused[:2]
        assert b"--max-connections" in refused[0]
    finally:
        for sock in socks:
            sock.close()
    time.sleep(0.5)
    assert limited_server.health() == 200
    good_request(limited_server)
    assert "the limit of --max-connections" in limited_server.log()


def test_idle_connections_are_closed_and_free_their_slots(limited_server: Server) -> None:
    socks = [socket.create_connection(("127.0.0.1", limited_server.port)) for _ in range(6)]
    try:
        assert all(_closed_within(s, 4.0)[0] for s in socks)
    finally:
        for sock in socks:
            sock.close()
    assert limited_server.health() == 200


def test_accept_error_log_is_rate_limited() -> None:
    log_filter = AcceptErrorFilter(interval_s=60.0)
    records = [
        logging.LogRecord("asyncio", logging.ERROR, __file__, 1, msg, None, None)
        for msg in ["socket.accept() out of system resource"] * 1000 + ["other error"]
    ]
    passed = [r for r in records if log_filter.filter(r)]
    assert [r.getMessage().split(" (")[0] for r in passed] == [
        "socket.accept() out of system resource",
        "other error",
    ]
