"""One request's failure stays that request's: the real engine in-process, failures injected
with monkeypatch, concurrent requests complete; 500s say nothing of paths or tracebacks; slow
template work runs off the event loop under a deadline; a full queue is refused before any
tokenizer work; ``/health`` sees a wedged engine loop."""

from __future__ import annotations

import json
import logging
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import pytest
from engine.entrypoints.openai import serving_chat
from inproc import InProcessServer, make_engine
from sec_helpers import read_sse, wait_idle

pytestmark = pytest.mark.timeout(180)
MAX_QUEUED = 8
SECRET = "open('/home/alice/.ssh/id_rsa') failed on 10.1.2.3"


@pytest.fixture(scope="module")
def srv(tiny_model: Path) -> Iterator[InProcessServer]:
    engine = make_engine(tiny_model, max_num_queued_reqs=MAX_QUEUED)
    server = InProcessServer(
        engine, request_prepare_timeout=1.0, health_stall_timeout=0.5, max_n=4
    ).start()
    yield server
    server.stop()
    engine.shutdown()


def chat_body(content: str, **extra: Any) -> dict[str, Any]:
    return {"model": "tiny", "messages": [{"role": "user", "content": content}], **extra}


def good(srv: InProcessServer, i: int, stream: bool = False) -> dict[str, Any]:
    body = chat_body(f"hello {i}", max_tokens=6, stream=stream, ignore_eos=True)
    if not stream:
        r = srv.post("/v1/chat/completions", body)
        assert r.status_code == 200, r.text
        return {"finish": r.json()["choices"][0]["finish_reason"]}
    with httpx.stream("POST", srv.base_url + "/v1/chat/completions", json=body, timeout=60) as r:
        assert r.status_code == 200
        events = read_sse(r)
    assert events[-1] == "[DONE]"
    finishes = [
        c["finish_reason"] for e in events if isinstance(e, dict) for c in e["choices"]
        if c.get("finish_reason")
    ]  # fmt: skip
    return {"finish": finishes[-1]}


def assert_no_leak(text: str) -> None:
    for leak in ("/home", "alice", "10.1.2.3", "Traceback", 'File "', "id_rsa", ".py"):
        assert leak not in text, (leak, text)


def idle(srv: InProcessServer) -> None:
    wait_idle(srv.base_url, {})


def test_template_failure_fails_only_that_request(
    srv: InProcessServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    real = srv.engine.apply_chat_template

    def flaky(messages: Any, *args: Any, **kwargs: Any) -> str:
        if "EXPLODE" in messages[-1]["content"]:
            raise RuntimeError("template blew up")
        return real(messages, *args, **kwargs)

    monkeypatch.setattr(srv.engine, "apply_chat_template", flaky)
    with ThreadPoolExecutor(8) as pool:
        goods = [pool.submit(good, srv, i, i % 2 == 0) for i in range(6)]
        bad = pool.submit(srv.post, "/v1/chat/completions", chat_body("EXPLODE", max_tokens=4))
        assert all(f.result()["finish"] == "length" for f in goods)
    r = bad.result()
    assert r.status_code == 400
    assert "Could not apply the chat template" in r.json()["error"]["message"]
    idle(srv)


def test_internal_error_is_generic_and_logged(
    srv: InProcessServer, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    tokenizer = srv.engine.tokenizer
    real_encode = tokenizer.encode

    def encode(text: Any, *args: Any, **kwargs: Any) -> Any:
        if isinstance(text, str) and "SECRET" in text:
            raise OSError(SECRET)
        return real_encode(text, *args, **kwargs)

    monkeypatch.setattr(tokenizer, "encode", encode)
    caplog.set_level(logging.ERROR, logger="engine.server")
    with ThreadPoolExecutor(6) as pool:
        goods = [pool.submit(good, srv, i) for i in range(4)]
        bads = [
            pool.submit(srv.post, path, body, headers={"X-Request-Id": f"leak-{i}"})
            for i, (path, body) in enumerate(
                [
                    ("/v1/chat/completions", chat_body("SECRET", max_tokens=3)),
                    ("/v1/completions", {"model": "tiny", "prompt": "SECRET", "max_tokens": 3}),
                    ("/tokenize", {"prompt": "SECRET"}),
                ]
            )
        ]
        assert all(f.result()["finish"] == "length" for f in goods)
    for i, future in enumerate(bads):
        r = future.result()
        assert r.status_code == 500, r.text
        assert_no_leak(r.text)
        error = r.json()["error"]
        assert f"leak-{i}" in error["message"] and error["code"] == "internal_error"
        assert "/" not in error["message"]
    logged = caplog.text
    assert SECRET in logged and "leak-0" in logged and "leak-2" in logged
    idle(srv)


def test_failure_mid_stream_sends_error_then_done(
    srv: InProcessServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    real = serving_chat.advance_all
    calls = {"n": 0}

    def advance(states: Any, out: Any, *args: Any) -> Any:
        if out.request_id == "boom-1":
            calls["n"] += 1
            if calls["n"] == 2:  # after the first delta went out
                raise ValueError(SECRET)
        return real(states, out, *args)

    monkeypatch.setattr(serving_chat, "advance_all", advance)
    body = chat_body("stream me", max_tokens=20, stream=True, ignore_eos=True)
    with ThreadPoolExecutor(6) as pool:
        goods = [pool.submit(good, srv, i, True) for i in range(4)]

        def bad() -> list[Any]:
            with httpx.stream(
                "POST", srv.base_url + "/v1/chat/completions", json=body,
                headers={"X-Request-Id": "boom-1"}, timeout=60,
            ) as r:  # fmt: skip
                assert r.status_code == 200
                return read_sse(r)

        events = pool.submit(bad).result()
        assert all(f.result()["finish"] == "length" for f in goods)
    assert events[-1] == "[DONE]"
    error = events[-2]
    assert isinstance(error, dict) and error["error"]["code"] == "internal_error"
    assert "boom-1" in error["error"]["message"]
    assert_no_leak(json.dumps(events))
    idle(srv)  # the failed stream's request was aborted in the engine: its blocks are back


def test_engine_step_failure_fails_the_batch_and_the_engine_goes_on(
    srv: InProcessServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    llm_engine = srv.engine.engine
    real_step = llm_engine.step
    state = {"failed": False}

    def step() -> Any:
        if not state["failed"] and llm_engine.get_num_unfinished_requests() >= 2:
            state["failed"] = True
            raise RuntimeError(SECRET)
        return real_step()

    monkeypatch.setattr(llm_engine, "step", step)
    with ThreadPoolExecutor(4) as pool:
        body = {"model": "tiny", "prompt": "Hi", "max_tokens": 30, "ignore_eos": True}
        results = list(pool.map(lambda _: srv.post("/v1/completions", body), range(3)))
    assert state["failed"]
    assert any(r.status_code == 500 for r in results), [r.status_code for r in results]
    for r in results:
        assert r.status_code in (200, 500)
        assert_no_leak(r.text)
    assert httpx.get(srv.base_url + "/health").status_code == 200
    assert [good(srv, i)["finish"] for i in range(2)] == ["length", "length"]
    idle(srv)


def test_slow_template_hits_the_deadline_without_blocking_the_loop(
    srv: InProcessServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    real = srv.engine.apply_chat_template

    def slow(messages: Any, *args: Any, **kwargs: Any) -> str:
        if "SLOW" in messages[-1]["content"]:
            time.sleep(3.0)  # a pathological render (timeout is 1 s)
        return real(messages, *args, **kwargs)

    monkeypatch.setattr(srv.engine, "apply_chat_template", slow)
    with ThreadPoolExecutor(2) as pool:
        start = time.monotonic()
        slow_future = pool.submit(srv.post, "/v1/chat/completions", chat_body("SLOW"))
        time.sleep(0.2)
        t0 = time.monotonic()
        health = httpx.get(srv.base_url + "/health", timeout=5)
        health_s = time.monotonic() - t0
        other = good(srv, 1)
        r = slow_future.result()
        elapsed = time.monotonic() - start
    assert health.status_code == 200 and health_s < 0.5, health_s
    assert other["finish"] == "length"
    assert r.status_code == 400 and "exceeded 1 s" in r.json()["error"]["message"], r.text
    assert elapsed < 2.5, elapsed


class WedgedStep:
    """Replaces ``LLMEngine.step`` with one that waits on an event (a wedged loop)."""

    def __init__(self, srv: InProcessServer, monkeypatch: pytest.MonkeyPatch) -> None:
        self.release = threading.Event()
        self.entered = threading.Event()
        real = srv.engine.engine.step

        def step() -> Any:
            self.entered.set()
            self.release.wait(60)
            return real()

        monkeypatch.setattr(srv.engine.engine, "step", step)


def test_full_queue_refused_before_tokenizing_and_health_sees_the_stall(
    srv: InProcessServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    wedge = WedgedStep(srv, monkeypatch)
    tokenizer = srv.engine.tokenizer
    real_encode = tokenizer.encode
    encodes = {"n": 0}

    def counting_encode(*args: Any, **kwargs: Any) -> Any:
        encodes["n"] += 1
        return real_encode(*args, **kwargs)

    monkeypatch.setattr(tokenizer, "encode", counting_encode)
    body = {"model": "tiny", "prompt": "queued", "max_tokens": 2}
    pool = ThreadPoolExecutor(MAX_QUEUED + 1)
    try:
        first = pool.submit(srv.post, "/v1/completions", body)  # running, stuck in step
        assert wedge.entered.wait(10)
        queued = [pool.submit(srv.post, "/v1/completions", body) for _ in range(MAX_QUEUED)]
        deadline = time.monotonic() + 10
        while srv.engine.would_reject() is None:
            assert time.monotonic() < deadline, "the queue did not fill"
            time.sleep(0.02)
        num_encodes = encodes["n"]
        t0 = time.monotonic()
        r = srv.post("/v1/completions", body)
        refuse_s = time.monotonic() - t0
        assert r.status_code == 503 and r.headers["retry-after"] == "1", r.text
        assert r.json()["error"]["code"] == "queue_full"
        assert "--max-num-queued-reqs" in r.json()["error"]["message"]
        assert encodes["n"] == num_encodes, "the refused request was tokenized"
        assert refuse_s < 0.5
        time.sleep(0.7)  # > health_stall_timeout with work pending
        health = httpx.get(srv.base_url + "/health")
        assert health.status_code == 503 and "no progress" in health.json()["error"]["message"]
        wedge.release.set()
        assert first.result().status_code == 200
        assert [f.result().status_code for f in queued] == [200] * MAX_QUEUED
    finally:
        wedge.release.set()
        pool.shutdown()
    assert httpx.get(srv.base_url + "/health").status_code == 200
    idle(srv)
