"""Bounded soak against the real server: a couple of thousand requests with random client
disconnects, cancellations and bursts past the queue bound. No request is lost or hung,
every answer is a complete response or a documented error, and afterwards the server is
idle with every KV block free (``/load`` and ``/metrics`` agree).

``SEC_SOAK_REQUESTS`` / ``SEC_SOAK_SECONDS`` change the size (default 2000 requests, at most
120 s); ``benchmarks/soak.py`` is the long version."""

from __future__ import annotations

import importlib.util
import os
import re
import sys
from pathlib import Path
from types import ModuleType

import httpx
import pytest
from sec_helpers import Server, good_request

pytestmark = pytest.mark.timeout(400)
ROOT = Path(__file__).resolve().parents[2]


def soak_module() -> ModuleType:
    spec = importlib.util.spec_from_file_location("engine_bench_soak", ROOT / "benchmarks/soak.py")
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses resolve annotations through sys.modules
    spec.loader.exec_module(module)
    return module


def gauge(text: str, name: str) -> float:
    m = re.search(rf"^{re.escape(name)}\{{[^}}]*\}} ([-+\deE.]+)$", text, re.M)
    assert m, f"{name} not in /metrics"
    return float(m.group(1))


def test_soak(sec_server: Server) -> None:
    soak = soak_module()
    config = soak.SoakConfig(
        base_url=sec_server.base_url,
        api_key=sec_server.api_key,
        num_requests=int(os.environ.get("SEC_SOAK_REQUESTS", "2000")),
        duration_s=float(os.environ.get("SEC_SOAK_SECONDS", "120")),
        concurrency=16,
        burst_size=32,
        request_timeout_s=60.0,
        seed=1,
    )
    result = soak.run_soak(config)
    summary = result.summary()
    assert not result.failures, summary
    assert result.num_requests >= min(config.num_requests, 200), summary
    outcomes = result.outcomes
    # A refused request returns at once and its client sends the next, so the share of
    # refusals grows with how slow the engine is next to the client on this machine (CI
    # saw 512 ok of 2007, 1391 refused); what must hold is that plenty got through.
    assert outcomes["ok"] >= min(200, result.num_requests // 10), summary
    assert outcomes["refused"] > 0, "no burst went past the queue bound"
    assert outcomes["cancelled"] > 0, "no client went away"
    assert outcomes["rejected"] > 0, "no hostile request was sent"
    assert result.passed, summary
    idle = result.idle_state
    assert (
        idle["num_free_blocks"]
        == idle["num_total_blocks"]
        == result.start_state["num_total_blocks"]
    )
    metrics = httpx.get(sec_server.base_url + "/metrics", headers=sec_server.headers).text
    assert gauge(metrics, "engine:num_requests_running") == 0
    assert gauge(metrics, "engine:num_requests_waiting") == 0
    assert gauge(metrics, "engine:kv_cache_usage_perc") == 0
    assert "Traceback" not in sec_server.log(), sec_server.log()[-3000:]
    good_request(sec_server)
