"""SIGTERM drain, full queue, engine failures: the real HTTP stack over the stand-in engine
(``engine.testing.fake_client``), which can be made slow, bounded or failing on purpose."""

from __future__ import annotations

import json
import signal
import threading
import time
from typing import Any

import httpx
import pytest

# Module level: `conftest` names this directory's conftest only while it is collected.
from conftest import REAL_SERVER_FLAGS, ServerProcess, engine_cli, free_port
from conftest import real_engine_available as available

pytestmark = pytest.mark.timeout(120)
MESSAGES = [{"role": "user", "content": "Hello"}]


def stream_events(url: str, body: dict[str, Any], out: list[dict[str, Any] | str]) -> None:
    with httpx.stream("POST", url, json=body, timeout=60) as r:
        assert r.status_code == 200, r.read()
        for line in r.iter_lines():
            if line.startswith("data: "):
                payload = line[len("data: ") :]
                out.append(payload if payload == "[DONE]" else json.loads(payload))


def finish_reasons(events: list[dict[str, Any] | str]) -> list[str]:
    return [
        c["finish_reason"]
        for e in events
        if isinstance(e, dict)
        for c in e.get("choices", [])
        if c.get("finish_reason")
    ]


def wait_for(predicate: Any, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(0.05)
    raise AssertionError("condition not met in time")


def test_sigterm_drains_in_flight_then_exits_0(make_fake_server: Any) -> None:
    srv = make_fake_server("--shutdown-timeout", "30", step_s=0.05)
    url = srv.base_url + "/v1/completions"
    events: list[dict[str, Any] | str] = []
    body = {"model": "fake", "prompt": "Hello", "max_tokens": 40, "stream": True}
    t = threading.Thread(target=stream_events, args=(url, body, events))
    t.start()
    wait_for(lambda: len(events) >= 3)
    srv.proc.send_signal(signal.SIGTERM)
    wait_for(lambda: httpx.get(srv.base_url + "/ready").status_code == 503)
    assert httpx.get(srv.base_url + "/ready").json()["error"]["code"] == "draining"
    assert httpx.get(srv.base_url + "/health").status_code == 200  # liveness: still alive
    late = httpx.post(url, json={"model": "fake", "prompt": "Hi", "max_tokens": 2})
    assert late.status_code == 503
    assert (
        late.json()["error"]["code"] == 503 and "shutting down" in late.json()["error"]["message"]
    )
    t.join(30)
    assert events[-1] == "[DONE]"
    assert finish_reasons(events) == ["length"]  # finished normally within the timeout
    assert srv.proc.wait(30) == 0


def test_sigterm_timeout_aborts_the_rest(make_fake_server: Any) -> None:
    srv = make_fake_server("--shutdown-timeout", "1", step_s=0.05)
    events: list[dict[str, Any] | str] = []
    body = {"model": "fake", "messages": MESSAGES, "max_tokens": 200, "stream": True}
    t = threading.Thread(
        target=stream_events, args=(srv.base_url + "/v1/chat/completions", body, events)
    )
    t.start()
    blocking: dict[str, Any] = {}

    def non_stream() -> None:
        r = httpx.post(
            srv.base_url + "/v1/completions",
            json={"model": "fake", "prompt": "Hi", "max_tokens": 200},
            timeout=60,
        )
        blocking["status"], blocking["body"] = r.status_code, r.json()

    t2 = threading.Thread(target=non_stream)
    t2.start()
    wait_for(lambda: len(events) >= 3)
    time.sleep(0.2)
    start = time.monotonic()
    srv.proc.send_signal(signal.SIGTERM)
    t.join(30)
    t2.join(30)
    assert time.monotonic() - start < 8
    assert events[-1] == "[DONE]"
    assert finish_reasons(events) == ["abort"]
    assert blocking["status"] == 200
    assert blocking["body"]["choices"][0]["finish_reason"] == "abort"
    assert srv.proc.wait(30) == 0
    assert "aborting 2 request(s)" in srv.log()


def test_full_queue_is_503_with_retry_after(make_fake_server: Any) -> None:
    srv = make_fake_server(max_running=1, max_queued=1, step_s=0.05)
    url = srv.base_url + "/v1/completions"
    results: list[httpx.Response] = []

    def call() -> None:
        body = {"model": "fake", "prompt": "Hi", "max_tokens": 20}
        results.append(httpx.post(url, json=body, timeout=60))

    threads = [threading.Thread(target=call) for _ in range(4)]
    for th in threads:
        th.start()
        time.sleep(0.1)
    for th in threads:
        th.join(30)
    statuses = sorted(r.status_code for r in results)
    assert statuses[0] == 200 and 503 in statuses
    full = next(r for r in results if r.status_code == 503)
    assert full.headers["retry-after"] == "1"
    assert full.json()["error"]["code"] == "queue_full"


def test_engine_error_mid_stream_sends_error_then_done(make_fake_server: Any) -> None:
    srv = make_fake_server()
    events: list[dict[str, Any] | str] = []
    body = {"model": "fake", "prompt": "please FAIL now", "max_tokens": 10, "stream": True}
    stream_events(srv.base_url + "/v1/completions", body, events)
    assert events[-1] == "[DONE]"
    error = events[-2]
    # The client gets a generic message with the request id; the detail goes to the log.
    assert isinstance(error, dict) and "Internal server error" in error["error"]["message"]
    assert "injected failure" not in error["error"]["message"]
    r = httpx.post(
        srv.base_url + "/v1/completions",
        json={"model": "fake", "prompt": "please FAIL now", "max_tokens": 10},
        headers={"X-Request-Id": "fail-42"},
    )
    assert r.status_code == 500 and "fail-42" in r.json()["error"]["message"]
    assert "injected failure" not in r.json()["error"]["message"]
    assert "injected failure" in srv.log() and "fail-42" in srv.log()
    # the server lives on
    ok = httpx.post(
        srv.base_url + "/v1/completions", json={"model": "fake", "prompt": "Hi", "max_tokens": 2}
    )
    assert ok.status_code == 200


def test_cors_only_when_allowed(make_fake_server: Any) -> None:
    srv = make_fake_server("--allowed-origins", "https://app.example")
    pre = httpx.options(
        srv.base_url + "/v1/models",
        headers={"Origin": "https://app.example", "Access-Control-Request-Method": "GET"},
    )
    assert pre.headers.get("access-control-allow-origin") == "https://app.example"
    other = httpx.get(srv.base_url + "/v1/models", headers={"Origin": "https://evil.example"})
    assert "access-control-allow-origin" not in other.headers


def test_real_engine_sigterm_aborts_and_exits_0(tmp_path: Any) -> None:
    """The real engine: SIGTERM with --shutdown-timeout 0 ends a long stream with abort."""
    if not available():
        pytest.skip("the real engine is not there yet")
    from engine_sdk.testing.models import build_tiny_model

    model = build_tiny_model(tmp_path / "tiny", "Qwen3ForCausalLM")
    port = free_port()
    cmd = [*engine_cli(), "serve", str(model), "--port", str(port), *REAL_SERVER_FLAGS]
    srv = ServerProcess([*cmd, "--shutdown-timeout", "0"], port).start()
    try:
        events: list[dict[str, Any] | str] = []
        body = {
            "model": "tiny", "prompt": "Hello", "max_tokens": 240, "stream": True,
            "ignore_eos": True,
        }  # fmt: skip
        t = threading.Thread(
            target=stream_events, args=(srv.base_url + "/v1/completions", body, events)
        )
        t.start()
        wait_for(lambda: len(events) >= 3)
        srv.proc.send_signal(signal.SIGTERM)
        t.join(30)
        assert events[-1] == "[DONE]"
        assert finish_reasons(events) == ["abort"]
        assert srv.proc.wait(30) == 0
    finally:
        srv.stop()
