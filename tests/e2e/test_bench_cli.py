"""``engine bench throughput | latency`` as a user runs them: a subprocess on a tiny model,
a saved JSON record, and a refused configuration as one readable line (exit 1)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from engine_sdk.testing.models import build_tiny_model

FLAGS = ["--device", "cpu", "--kv-cache-memory-bytes", str(8 << 20)]


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_tiny_model(tmp_path_factory.mktemp("bench"), "Qwen3ForCausalLM")


def bench(*args: str) -> subprocess.CompletedProcess[str]:
    cmd = [sys.executable, "-m", "engine.cli.main", "bench", *args]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=300)


def test_throughput_and_latency_save_records(model_dir: Path, tmp_path: Path) -> None:
    out = tmp_path / "tp.json"
    r = bench(
        "throughput", "--model", str(model_dir), *FLAGS, "--num-prompts", "6",
        "--input-len", "8", "--output-len", "5", "--save-result", str(out),
    )  # fmt: skip
    assert r.returncode == 0, r.stderr[-2000:]
    record = json.loads(out.read_text())
    assert record["benchmark"] == "throughput"
    assert record["output_tokens"] == 30 and record["prompt_tokens"] == 48
    assert record["output_tokens_per_s"] > 0 and "command" in record
    facts = record["engine"]
    assert facts["kv_cache_bytes"] <= 8 << 20 and facts["weights_bytes"] > 0
    assert facts["kv_tokens"] == facts["num_blocks"] * facts["block_size"] > 0
    out = tmp_path / "lat.json"
    r = bench(
        "latency", "--model", str(model_dir), *FLAGS, "--batch-size", "2", "--input-len", "8",
        "--output-len", "4", "--num-iters", "2", "--num-iters-warmup", "0",
        "--save-result", str(out),
    )  # fmt: skip
    assert r.returncode == 0, r.stderr[-2000:]
    record = json.loads(out.read_text())
    assert record["batch_size"] == 2 and record["output_len"] == 4
    assert record["ms_per_output_token"] > 0


def test_refused_configuration_is_one_line(model_dir: Path) -> None:
    r = bench("latency", "--model", str(model_dir), *FLAGS, "--quantization", "awq")
    assert r.returncode == 1
    assert "Traceback" not in r.stderr and "╭" not in r.stderr, r.stderr[-2000:]
    assert "quantization 'awq' (--quantization)" in r.stderr
    assert "AutoAWQ checkpoint" in r.stderr
