"""``engine bench serve`` against the real server: every request completes with the asked
output length, latencies are recorded, and ``--num-workers`` splits the load over client
processes with the same totals."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest
from conftest import API_KEY, ServerProcess, engine_cli


@pytest.mark.parametrize("workers", [1, 2])
def test_bench_serve_records_every_request(
    server: ServerProcess, tmp_path: Path, workers: int
) -> None:
    out = tmp_path / "serve.json"
    cmd = [
        *engine_cli(), "bench", "serve", "--base-url", server.base_url + "/v1",
        "--num-prompts", "6", "--input-len", "12", "--output-len", "5", "--vocab-size", "300",
        "--max-concurrency", "4", "--num-workers", str(workers), "--save-result", str(out),
    ]  # fmt: skip
    env = {**os.environ, "ENGINE_API_KEY": API_KEY}
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=300, env=env)
    assert r.returncode == 0, r.stderr[-2000:]
    record = json.loads(out.read_text())
    assert record["completed"] == 6 and record["failed"] == 0, record["errors"]
    assert record["output_tokens_per_s"] > 0
    assert record["ttft_ms"]["p50"] > 0 and record["e2e_ms"]["p50"] >= record["ttft_ms"]["p50"]
    assert record["tpot_ms"]["p50"] > 0
    if workers > 1:
        assert record["num_client_workers"] == 2


def test_bench_serve_reports_failures(server: ServerProcess, tmp_path: Path) -> None:
    """Without the key every request fails with 401, and the record says so."""
    out = tmp_path / "fail.json"
    cmd = [
        *engine_cli(), "bench", "serve", "--base-url", server.base_url + "/v1",
        "--model", "tiny", "--num-prompts", "3", "--input-len", "4", "--output-len", "2",
        "--vocab-size", "300", "--save-result", str(out),
    ]  # fmt: skip
    env = {k: v for k, v in os.environ.items() if k != "ENGINE_API_KEY"}
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=300, env=env)
    assert r.returncode == 0, r.stderr[-2000:]
    record = json.loads(out.read_text())
    assert record["completed"] == 0 and record["failed"] == 3
    assert any("401" in e for e in record["errors"])
