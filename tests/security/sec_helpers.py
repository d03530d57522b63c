"""Helpers of the security suite: a real ``engine serve`` subprocess on a tiny model, raw
HTTP requests (paths exactly as written, no client-side normalisation), SSE reading and
idle checks on ``/load``."""

from __future__ import annotations

import json
import socket
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
from engine_sdk.testing.server import ServerProcess
from engine_sdk.testing.server import free_port as free_port  # re-exported for the suite

API_KEY = "sec-key-456"
STARTUP_TIMEOUT_S = 120.0
# Small bounds so the hostile corpus and the overload tests hit them cheaply.
SERVER_FLAGS = [
    "--device", "cpu", "--dtype", "float32", "--max-model-len", "128",
    "--kv-cache-memory-bytes", str(2 * 1024 * 1024), "--max-num-seqs", "8",
    "--max-num-queued-reqs", "16", "--served-model-name", "tiny",
    "--log-stats-interval", "0", "--max-request-body-bytes", str(256 * 1024),
    "--max-header-bytes", str(16 * 1024), "--max-n", "4",
    "--structured-outputs-config.compile-timeout-s", "5",
]  # fmt: skip


@dataclass
class Server(ServerProcess):
    """The SDK's server subprocess with the suite's key, given through ENGINE_API_KEY."""

    api_key: str | None = API_KEY
    key_in_env: bool = True
    startup_timeout_s: float = STARTUP_TIMEOUT_S


def serve_cmd(model: Path, port: int, *extra: str) -> list[str]:
    return [
        sys.executable, "-m", "engine.cli.main", "serve", str(model), "--port", str(port),
        *SERVER_FLAGS, *extra,
    ]  # fmt: skip


def raw_request(
    port: int, method: str, path: str, headers: dict[str, str] | None = None,
    body: bytes = b"", timeout: float = 10.0,
) -> tuple[int, bytes]:  # fmt: skip
    """Send one HTTP/1.1 request byte for byte; (status, body). Status 0: no answer."""
    lines = [f"{method} {path} HTTP/1.1", f"Host: 127.0.0.1:{port}", "Connection: close"]
    for name, value in (headers or {}).items():
        lines.append(f"{name}: {value}")
    if body or method in ("POST", "PUT"):
        lines.append(f"Content-Length: {len(body)}")
    data = ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1") + body
    with socket.create_connection(("127.0.0.1", port), timeout=timeout) as sock:
        try:
            sock.sendall(data)
        except OSError:
            pass  # the server may refuse before reading everything
        chunks = []
        try:
            while True:
                chunk = sock.recv(65536)
                if not chunk:
                    break
                chunks.append(chunk)
        except (ConnectionResetError, TimeoutError):
            pass
    response = b"".join(chunks)
    if not response.startswith(b"HTTP/1."):
        return 0, response
    head, _, rest = response.partition(b"\r\n\r\n")
    return int(head.split(b" ", 2)[1]), rest


def read_sse(response: httpx.Response) -> list[dict[str, Any] | str]:
    events: list[dict[str, Any] | str] = []
    for line in response.iter_lines():
        if line.startswith("data: "):
            payload = line[len("data: ") :]
            events.append(payload if payload == "[DONE]" else json.loads(payload))
    return events


def load(base_url: str, headers: dict[str, str]) -> dict[str, Any]:
    r = httpx.get(base_url + "/load", headers=headers, timeout=10)
    assert r.status_code == 200, r.text
    return dict(r.json())


def wait_idle(base_url: str, headers: dict[str, str], timeout: float = 30.0) -> dict[str, Any]:
    """Wait for zero running, zero waiting, 0 KV usage and every block free."""
    deadline = time.monotonic() + timeout
    state = load(base_url, headers)
    while time.monotonic() < deadline:
        state = load(base_url, headers)
        idle = state["num_requests_running"] == 0 and state["num_requests_waiting"] == 0
        if idle and state["kv_cache_usage"] == 0 and state["num_http_requests_in_flight"] == 0:
            if state["num_free_blocks"] == state["num_total_blocks"]:
                return state
        time.sleep(0.1)
    raise AssertionError(f"server did not go idle in {timeout}s: {state}")


def good_request(server: Server) -> None:
    """A normal request still succeeds (the server lives on after the hostile ones)."""
    body = {"model": "tiny", "prompt": "Hello", "max_tokens": 2}
    r = httpx.post(server.base_url + "/v1/completions", json=body, headers=server.headers)
    assert r.status_code == 200, r.text
    assert len(r.json()["choices"]) == 1
