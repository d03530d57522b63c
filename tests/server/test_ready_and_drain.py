"""Readiness (``/ready``), liveness (``/health``) and the SIGTERM drain with
``--shutdown-timeout``, on real ``engine serve`` processes over a tiny random model."""

from __future__ import annotations

import signal
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

# Module level: `conftest` names this directory's conftest only while it is collected.
from conftest import REAL_SERVER_FLAGS, ServerProcess, engine_cli, free_port
from conftest import real_engine_available as available
from test_shutdown_and_failures import finish_reasons, stream_events, wait_for

pytestmark = [
    pytest.mark.timeout(180),
    pytest.mark.skipif(not available(), reason="needs the real engine"),
]
KEY = "ready-key"


def start_server(model: Path, *flags: str, api_key: str | None = None) -> ServerProcess:
    port = free_port()
    cmd = [*engine_cli(), "serve", str(model), "--port", str(port), *REAL_SERVER_FLAGS, *flags]
    return ServerProcess(cmd, port, api_key=api_key, key_in_env=api_key is not None).start()


@pytest.fixture(scope="module")
def model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from engine_sdk.testing.models import build_tiny_model

    return build_tiny_model(tmp_path_factory.mktemp("tiny-ready"), "Qwen3ForCausalLM")


@pytest.fixture(scope="module")
def keyed_server(model: Path) -> Iterator[ServerProcess]:
    srv = start_server(model, api_key=KEY)
    yield srv
    srv.stop()


def test_ready_and_health_need_no_key(keyed_server: ServerProcess) -> None:
    ready = httpx.get(keyed_server.base_url + "/ready")
    assert ready.status_code == 200 and ready.json() == {"status": "ready"}
    assert httpx.get(keyed_server.base_url + "/health").status_code == 200
    # the key still guards everything else
    assert httpx.get(keyed_server.base_url + "/v1/models").status_code == 401
    assert httpx.get(keyed_server.base_url + "/load").status_code == 401


def test_sigterm_ready_turns_503_and_in_flight_finishes(model: Path) -> None:
    srv = start_server(model, "--shutdown-timeout", "60", "--max-model-len", "512")
    try:
        events: list[dict[str, Any] | str] = []
        body = {
            "model": "tiny", "prompt": "Hello", "max_tokens": 500, "stream": True,
            "ignore_eos": True,
        }  # fmt: skip
        url = srv.base_url + "/v1/completions"
        t = threading.Thread(target=stream_events, args=(url, body, events))
        t.start()
        wait_for(lambda: len(events) >= 3)
        srv.proc.send_signal(signal.SIGTERM)  # type: ignore[union-attr]
        wait_for(lambda: httpx.get(srv.base_url + "/ready").status_code == 503, timeout=5)
        ready = httpx.get(srv.base_url + "/ready").json()["error"]
        assert ready["code"] == "draining" and "--shutdown-timeout" in ready["message"]
        if t.is_alive():  # while the stream drains: alive, but no new work
            assert httpx.get(srv.base_url + "/health").status_code == 200
            late = httpx.post(url, json={"model": "tiny", "prompt": "Hi", "max_tokens": 2})
            assert late.status_code == 503 and "shutting down" in late.json()["error"]["message"]
        t.join(60)
        assert events[-1] == "[DONE]"
        assert finish_reasons(events) == ["length"]  # it finished within the timeout
        assert srv.proc.wait(30) == 0  # type: ignore[union-attr]
    finally:
        srv.stop()


def test_sigterm_aborts_what_outlives_the_shutdown_timeout(model: Path) -> None:
    timeout_s = 0.3
    srv = start_server(model, "--shutdown-timeout", str(timeout_s), "--max-model-len", "512")
    try:
        streams: list[list[dict[str, Any] | str]] = [[] for _ in range(3)]
        body = {
            "model": "tiny", "prompt": "Hello", "max_tokens": 500, "stream": True,
            "ignore_eos": True,
        }  # fmt: skip
        url = srv.base_url + "/v1/completions"
        threads = [threading.Thread(target=stream_events, args=(url, body, s)) for s in streams]
        for t in threads:
            t.start()
        wait_for(lambda: all(len(s) >= 3 for s in streams))
        signalled = time.monotonic()
        srv.proc.send_signal(signal.SIGTERM)  # type: ignore[union-attr]
        for t in threads:
            t.join(30)
        elapsed = time.monotonic() - signalled
        for events in streams:
            assert events[-1] == "[DONE]"
            assert finish_reasons(events) == ["abort"]  # a clean end, not a cut connection
            num_tokens = sum(1 for e in events if isinstance(e, dict) and e.get("choices"))
            assert num_tokens < 500
        assert timeout_s <= elapsed < timeout_s + 8  # waited for the timeout, then aborted
        assert srv.proc.wait(30) == 0  # type: ignore[union-attr]
        assert "aborting 3 request(s)" in srv.log()
    finally:
        srv.stop()
