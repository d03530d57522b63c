"""Whole-process behaviour of ``engine serve`` with the real engine: SIGTERM under load
answers every request (complete, ``abort`` or 503) and exits 0; a wedged engine loop turns
``/health`` to 503 and the watchdog ends the server with exit code 1 after failing the
requests in flight."""

from __future__ import annotations

import json
import signal
import sys
import threading
import time
from pathlib import Path
from typing import Any

import httpx
import pytest
from engine_sdk.testing.server import child_pids, process_cmdline, wait_gone
from sec_helpers import SERVER_FLAGS, Server, free_port, read_sse, serve_cmd

pytestmark = pytest.mark.timeout(240)
HERE = Path(__file__).parent


def finish_reasons(events: list[Any]) -> list[str]:
    return [
        c["finish_reason"] for e in events if isinstance(e, dict)
        for c in e.get("choices", []) if c.get("finish_reason")
    ]  # fmt: skip


def test_sigterm_under_load_answers_everyone(tiny_model: Path) -> None:
    port = free_port()
    server = Server(serve_cmd(tiny_model, port, "--shutdown-timeout", "0.3"), port).start()
    outcomes: list[tuple[str, Any]] = []
    lock = threading.Lock()
    first_tokens = threading.Semaphore(0)

    def stream_one(i: int) -> None:
        body = {
            "model": "tiny", "prompt": f"story {i}", "max_tokens": 120, "ignore_eos": True,
            "stream": True,
        }  # fmt: skip
        try:
            with httpx.stream(
                "POST", server.base_url + "/v1/completions", json=body, headers=server.headers,
                timeout=60,
            ) as r:  # fmt: skip
                if r.status_code != 200:
                    r.read()
                    with lock:
                        outcomes.append(("status", r.status_code))
                    return
                events: list[Any] = []
                for line in r.iter_lines():
                    if line.startswith("data: "):
                        payload = line[6:]
                        events.append(payload if payload == "[DONE]" else json.loads(payload))
                        if len(events) == 1:
                            first_tokens.release()
            with lock:
                outcomes.append(("stream", events))
        except httpx.HTTPError as exc:
            with lock:
                outcomes.append(("transport", repr(exc)))

    threads = [threading.Thread(target=stream_one, args=(i,)) for i in range(16)]
    for t in threads:
        t.start()
    for _ in range(4):  # some streams are under way
        assert first_tokens.acquire(timeout=60)
    assert server.proc is not None
    server.proc.send_signal(signal.SIGTERM)
    time.sleep(0.2)
    try:  # a request after SIGTERM: 503 while draining (or no listener once it exited)
        late: httpx.Response | None = httpx.post(
            server.base_url + "/v1/completions", json={"model": "tiny", "prompt": "late"},
            headers=server.headers, timeout=10,
        )  # fmt: skip
    except httpx.ConnectError:
        late = None
    for t in threads:
        t.join(90)
        assert not t.is_alive(), "a request was left hanging"
    assert server.proc.wait(60) == 0, server.log()[-3000:]
    assert len(outcomes) == 16
    reasons: list[str] = []
    for kind, value in outcomes:
        if kind == "stream":
            assert value[-1] == "[DONE]", value[-3:]
            got = finish_reasons(value)
            assert got and set(got) <= {"length", "abort"}, got
            reasons += got
        else:
            assert (kind, value) == ("status", 503), (kind, value)
    assert "abort" in reasons, "the drain timeout did not abort anything"
    if late is not None:
        assert late.status_code == 503 and late.headers.get("retry-after")
    assert "Shutdown timeout reached" in server.log()


@pytest.mark.parametrize("mode", ["--engine-process", "--no-engine-process"])
def test_wedged_loop_fails_health_then_watchdog_exits_1(tiny_model: Path, mode: str) -> None:
    port = free_port()
    flags = [
        str(tiny_model), "--port", str(port), *SERVER_FLAGS,
        "--watchdog-timeout", "3", "--health-stall-timeout", "1", mode,
    ]  # fmt: skip
    server = Server([sys.executable, str(HERE / "wedge_server.py"), *flags], port).start()
    assert server.proc is not None
    results: dict[str, Any] = {}

    def call(name: str, request_id: str, stream: bool) -> None:
        body = {"model": "tiny", "prompt": "hi", "max_tokens": 4, "stream": stream}
        headers = {**server.headers, "X-Request-Id": request_id}
        try:
            with httpx.stream(
                "POST", server.base_url + "/v1/completions", json=body, headers=headers,
                timeout=60,
            ) as r:  # fmt: skip
                results[name] = (r.status_code, read_sse(r) if r.status_code == 200 else r.read())
        except httpx.HTTPError as exc:
            results[name] = ("transport", repr(exc))

    threads = [
        threading.Thread(target=call, args=("wedged", "wedge-1", False)),
        threading.Thread(target=call, args=("bystander", "other-1", True)),
    ]
    for t in threads:
        t.start()
    deadline = time.monotonic() + 20
    health = 200
    while time.monotonic() < deadline and server.proc.poll() is None:
        try:
            health = httpx.get(server.base_url + "/health", timeout=2).status_code
        except httpx.HTTPError:
            break
        if health == 503:
            break
        time.sleep(0.2)
    assert health == 503, "a wedged loop still reported healthy"
    assert server.proc.wait(30) == 1
    for t in threads:
        t.join(30)
        assert not t.is_alive(), "a request was left hanging"
    log = server.log()
    assert "watchdog: the engine loop made no progress" in log, log[-3000:]
    assert results["wedged"][0] == 503, results  # failed by the watchdog, not left hanging
    status, events = results["bystander"]
    assert status in (200, 503, "transport"), (results, log[-4000:])
    if status == 200:  # finished before the wedge, or failed mid-stream by the watchdog
        assert events[-1] == "[DONE]", events


def test_engine_process_exits_when_the_server_is_killed(tiny_model: Path) -> None:
    """SIGKILL of the server (no drain, no pipe message) must not leave the engine
    process behind, even while its step is wedged and it reads nothing."""
    port = free_port()
    flags = [str(tiny_model), "--port", str(port), *SERVER_FLAGS]
    server = Server([sys.executable, str(HERE / "wedge_server.py"), *flags], port).start()
    assert server.proc is not None
    engines = [p for p in child_pids(server.proc.pid) if "spawn_main" in process_cmdline(p)]
    assert len(engines) == 1, engines
    body = {"model": "tiny", "prompt": "hi", "max_tokens": 4}
    headers = {**server.headers, "X-Request-Id": "wedge-kill"}
    with pytest.raises(httpx.HTTPError):  # wedges the engine step; the server then dies
        threading.Timer(2.0, server.proc.kill).start()
        httpx.post(server.base_url + "/v1/completions", json=body, headers=headers, timeout=30)
    server.proc.wait(10)
    assert wait_gone(engines[0], 15), "the engine process outlived its server"
