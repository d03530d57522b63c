"""Disconnects free KV blocks, metrics move under load, 32 concurrent requests succeed."""

from __future__ import annotations

import asyncio
import re
import time

import httpx
import openai
import pytest
from conftest import API_KEY, ServerProcess

pytestmark = pytest.mark.timeout(120)
MESSAGES = [{"role": "user", "content": "Tell me a story about a little model."}]


def load(server: ServerProcess) -> dict[str, float]:
    r = httpx.get(server.base_url + "/load", headers=server.headers)
    assert r.status_code == 200
    return r.json()


def metric(text: str, name: str, labels: str = "") -> float:
    """Sum of the samples of ``name`` whose label set contains ``labels``."""
    total = 0.0
    found = False
    for line in text.splitlines():
        m = re.match(r"^([a-zA-Z_:][\w:]*)(\{[^}]*\})? ([-+\deE.na]+)$", line)
        if m and m.group(1) == name and labels in (m.group(2) or ""):
            total += float(m.group(3))
            found = True
    assert found, f"{name}{{{labels}}} not in /metrics"
    return total


def scrape(server: ServerProcess) -> str:
    r = httpx.get(server.base_url + "/metrics", headers=server.headers)
    assert r.status_code == 200
    return r.text


def wait_idle(server: ServerProcess, timeout: float = 20.0) -> dict[str, float]:
    deadline = time.monotonic() + timeout
    state = load(server)
    while time.monotonic() < deadline:
        state = load(server)
        if state["num_requests_running"] == 0 and state["num_requests_waiting"] == 0:
            if state["kv_cache_usage"] == 0:
                return state
        time.sleep(0.1)
    raise AssertionError(f"server did not go idle: {state}")


def test_load_reports_blocks(server: ServerProcess) -> None:
    state = wait_idle(server)
    assert state["num_total_blocks"] > 0
    assert state["num_free_blocks"] == state["num_total_blocks"]


def test_stream_disconnect_frees_blocks(server: ServerProcess) -> None:
    start = wait_idle(server)
    body = {
        "model": "tiny", "messages": MESSAGES, "max_tokens": 200, "stream": True,
        "ignore_eos": True,
    }  # fmt: skip
    with httpx.stream(
        "POST", server.base_url + "/v1/chat/completions", json=body, headers=server.headers
    ) as r:
        lines = r.iter_lines()
        for _ in range(6):  # a few chunks in: the request holds blocks now
            next(lines)
        busy = load(server)
        assert busy["num_requests_running"] + busy["num_requests_waiting"] >= 1
        assert busy["num_free_blocks"] < start["num_free_blocks"]
    # the client closed the connection mid-stream
    end = wait_idle(server)
    assert end["num_free_blocks"] == start["num_free_blocks"]
    assert end["num_http_requests_in_flight"] == 0


def test_non_stream_disconnect_frees_blocks(server: ServerProcess) -> None:
    start = wait_idle(server)
    # long enough that the client's 0.1 s timeout always cuts it (a tiny model on an idle
    # CPU finished 200 tokens inside 0.3 s)
    body = {"model": "tiny", "prompt": "Hello", "max_tokens": 250, "ignore_eos": True}
    with pytest.raises(httpx.TimeoutException):
        httpx.post(
            server.base_url + "/v1/completions", json=body, headers=server.headers, timeout=0.1
        )
    end = wait_idle(server)
    assert end["num_free_blocks"] == start["num_free_blocks"]
    after = scrape(server)
    assert metric(after, "engine:request_success_total", 'finish_reason="abort"') >= 1


def test_metrics_move_under_load(server: ServerProcess) -> None:
    before = scrape(server)
    assert "# TYPE engine:time_to_first_token_seconds histogram" in before
    for name in ("engine:num_requests_running", "engine:kv_cache_usage_perc"):
        assert 'model_name="tiny"' in [ln for ln in before.splitlines() if ln.startswith(name)][0]
    client = openai.OpenAI(base_url=server.base_url + "/v1", api_key=API_KEY, max_retries=0)
    for _ in range(2):
        client.completions.create(
            model="tiny", prompt="Hello world", max_tokens=5, extra_body={"ignore_eos": True}
        )
    after = scrape(server)
    assert (
        metric(after, "engine:generation_tokens_total")
        >= metric(before, "engine:generation_tokens_total") + 10
    )
    assert metric(after, "engine:prompt_tokens_total") > metric(
        before, "engine:prompt_tokens_total"
    )
    assert metric(after, "engine:request_success_total", 'finish_reason="length"') >= 2 + metric(
        before, "engine:request_success_total", 'finish_reason="length"'
    )
    for hist in (
        "time_to_first_token_seconds", "e2e_request_latency_seconds",
        "inter_token_latency_seconds", "request_prefill_time_seconds",
        "request_decode_time_seconds",
    ):  # fmt: skip
        name = f"engine:{hist}_count"
        assert metric(after, name) > metric(before, name), hist
    for counter in (
        "num_preemptions",
        "prefix_cache_queries",
        "prefix_cache_hits",
    ):
        metric(after, f"engine:{counter}_total")  # present


def test_32_concurrent_requests(server: ServerProcess) -> None:
    async def run() -> list[object]:
        client = openai.AsyncOpenAI(
            base_url=server.base_url + "/v1", api_key=API_KEY, max_retries=0, timeout=60
        )
        jobs = []
        for i in range(32):
            if i % 2:
                jobs.append(
                    client.completions.create(
                        model="tiny",
                        prompt=f"Number {i}:",
                        max_tokens=8,
                        extra_body={"ignore_eos": True},
                    )  # fmt: skip
                )
            else:
                jobs.append(
                    client.chat.completions.create(
                        model="tiny",
                        messages=MESSAGES,
                        max_tokens=8,
                        extra_body={"ignore_eos": True},
                    )  # fmt: skip
                )
        return await asyncio.gather(*jobs)

    results = asyncio.run(run())
    assert len(results) == 32
    for res in results:
        assert res.usage.completion_tokens == 8  # type: ignore[attr-defined]
    wait_idle(server)


def test_stats_line_logged(server: ServerProcess) -> None:
    # the server runs with --log-stats-interval 1 and the tests above kept it busy
    assert re.search(r"Engine stats: prompt [\d.]+ tok/s, generation [\d.]+ tok/s", server.log())
    assert "Engine ready at http://127.0.0.1:" in server.log()
    assert "Resolved configuration" in server.log()
