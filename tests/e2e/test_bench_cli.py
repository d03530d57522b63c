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


def test_throughput_runs_a_custom_dataset(model_dir: Path, tmp_path: Path) -> None:
    """vLLM's custom-dataset JSONL: text prompts tokenized as LLM.generate does, token-id
    prompts as given, each line's output length (the W4 runs beside vLLM share one file)."""
    from transformers import AutoTokenizer

    lines = [
        {"prompt": "the quick brown fox", "output_tokens": 3},
        {"prompt_token_ids": [5, 6, 7, 8, 9], "output_tokens": 2},
        {"prompt": "jumps over the lazy dog again", "output_tokens": 4},
    ]
    data = tmp_path / "requests.jsonl"
    data.write_text("".join(json.dumps(line) + "\n" for line in lines) + "\n")
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    want_prompt = len(tokenizer.encode(lines[0]["prompt"])) + 5
    want_prompt += len(tokenizer.encode(lines[2]["prompt"]))
    out = tmp_path / "custom.json"
    r = bench(
        "throughput", "--model", str(model_dir), *FLAGS, "--dataset-name", "custom",
        "--dataset-path", str(data), "--save-result", str(out), "--temperature", "0",
    )  # fmt: skip
    assert r.returncode == 0, r.stderr[-2000:]
    record = json.loads(out.read_text())
    assert record["num_requests"] == 3
    assert record["prompt_tokens"] == want_prompt and record["output_tokens"] == 9


def test_custom_dataset_errors_name_the_flag_and_line(model_dir: Path, tmp_path: Path) -> None:
    r = bench("throughput", "--model", str(model_dir), *FLAGS, "--dataset-name", "custom")
    assert r.returncode != 0 and "--dataset-path" in r.stderr, r.stderr[-2000:]
    assert "Traceback" not in r.stderr
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"prompt": "fine", "output_tokens": 2}\n{"prompt": "no length"}\n')
    r = bench(
        "throughput", "--model", str(model_dir), *FLAGS, "--dataset-name", "custom",
        "--dataset-path", str(bad),
    )  # fmt: skip
    assert r.returncode == 1 and "line 2" in r.stderr and "output_tokens" in r.stderr
    assert "Traceback" not in r.stderr and "╭" not in r.stderr, r.stderr[-2000:]


def test_custom_requests_reads_the_jsonl_format(tmp_path: Path) -> None:
    from engine.benchmarks.datasets import custom_requests

    data = tmp_path / "r.jsonl"
    data.write_text(
        '{"prompt": "ab", "output_tokens": 2}\n\n{"prompt_token_ids": [1, 2], "output_tokens": 5}\n'
        '{"prompt": "abc", "output_tokens": 1}\n'
    )
    encode = lambda text: [ord(c) for c in text]  # noqa: E731
    got = custom_requests(data, encode)
    assert [(r.prompt_token_ids, r.output_len) for r in got] == [
        ([97, 98], 2), ([1, 2], 5), ([97, 98, 99], 1)
    ]  # fmt: skip
    assert len(custom_requests(data, encode, num_prompts=2)) == 2
    assert {r.output_len for r in custom_requests(data, encode, output_len=7)} == {7}
    for text, message in (
        ("not json\n", "line 1: not JSON"),
        ('{"output_tokens": 3}\n', "'prompt' string"),
        ('{"prompt": "a", "output_tokens": 0}\n', "positive integer"),
        ('{"prompt": "", "output_tokens": 2}\n', "no tokens"),
        ("\n", "no requests"),
    ):
        data.write_text(text)
        with pytest.raises(ValueError, match=message):
            custom_requests(data, encode)
