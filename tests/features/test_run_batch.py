"""``engine run-batch`` in a subprocess on the tiny Qwen3: chat, completions and responses
lines answered in the OpenAI batch output format, bad lines recorded (never fatal), the
answers equal to what the server gives for the same requests, and usage errors."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

import pytest
from features_server import SERVER_FLAGS, engine_cli

pytestmark = pytest.mark.timeout(300)

CHAT = {"model": "tiny", "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 6,
        "temperature": 0}  # fmt: skip
LINES: list[Any] = [
    {"custom_id": "chat", "method": "POST", "url": "/v1/chat/completions", "body": CHAT},
    {"custom_id": "cmpl", "method": "POST", "url": "/v1/completions",
     "body": {"model": "tiny", "prompt": "Once", "max_tokens": 5, "temperature": 0}},
    {"custom_id": "resp", "method": "POST", "url": "/v1/responses",
     "body": {"model": "tiny", "input": "Hi", "max_output_tokens": 6, "temperature": 0}},
    {"custom_id": "bad-url", "method": "POST", "url": "/v1/images", "body": {}},
    {"custom_id": "bad-body", "method": "POST", "url": "/v1/chat/completions",
     "body": {**CHAT, "max_tokens": -3}},
    {"custom_id": "bad-model", "method": "POST", "url": "/v1/completions",
     "body": {"model": "nope", "prompt": "x", "max_tokens": 2}},
    {"custom_id": "stream", "method": "POST", "url": "/v1/chat/completions",
     "body": {**CHAT, "stream": True}},
    "this line is not JSON",
    {"custom_id": "chat-again", "method": "POST", "url": "/v1/chat/completions", "body": CHAT},
]  # fmt: skip


def _run(tmp_path: Path, model: Path, *extra: str) -> tuple[subprocess.CompletedProcess[str], Path]:
    src, dst = tmp_path / "in.jsonl", tmp_path / "out.jsonl"
    text = "\n".join(line if isinstance(line, str) else json.dumps(line) for line in LINES)
    src.write_text(text + "\n\n")
    flags = [f for f in SERVER_FLAGS if f != "--log-stats-interval" and f != "0"]
    cmd = [*engine_cli(), "run-batch", "-i", str(src), "-o", str(dst), str(model), *flags,
           "--served-model-name", "tiny", *extra]  # fmt: skip
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=240)
    return done, dst


def test_run_batch_records_every_line(tiny_model: Path, tmp_path: Path) -> None:
    done, dst = _run(tmp_path, tiny_model, "--max-concurrency", "3")
    assert done.returncode == 0, done.stderr[-3000:]
    records = [json.loads(line) for line in dst.read_text().splitlines()]
    assert len(records) == len(LINES)
    by_id = {r["custom_id"]: r for r in records}
    for custom_id in ("chat", "cmpl", "resp", "chat-again"):
        record = by_id[custom_id]
        assert record["error"] is None and record["response"]["status_code"] == 200
        assert record["id"].startswith("batch_req_")
    chat = by_id["chat"]["response"]["body"]
    assert chat["object"] == "chat.completion" and chat["usage"]["completion_tokens"] >= 1
    # Greedy: the same request twice gives the same text, and the responses route's text
    # (same messages) is the chat text.
    again = by_id["chat-again"]["response"]["body"]
    assert again["choices"][0]["message"]["content"] == chat["choices"][0]["message"]["content"]
    resp = by_id["resp"]["response"]["body"]
    assert resp["object"] == "response"
    assert resp["output"][0]["content"][0]["text"] == chat["choices"][0]["message"]["content"]
    assert by_id["cmpl"]["response"]["body"]["object"] == "text_completion"
    assert by_id["bad-url"]["response"] is None
    assert "/v1/images" in by_id["bad-url"]["error"]["message"]
    assert by_id["bad-body"]["response"]["status_code"] == 400
    assert by_id["bad-body"]["error"]["message"]
    assert by_id["bad-model"]["response"]["status_code"] == 404
    assert "stream" in by_id["stream"]["error"]["message"]
    assert by_id[None]["error"]["code"] == "invalid_batch_line"  # the non-JSON line
    assert "9 line(s): 4 succeeded, 5 failed" in done.stderr


def test_run_batch_usage_errors(tiny_model: Path, tmp_path: Path) -> None:
    cmd = [*engine_cli(), "run-batch", "-o", str(tmp_path / "o.jsonl"), str(tiny_model)]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=60)
    assert done.returncode == 2 and "-i/--input-file" in done.stderr
    missing = tmp_path / "missing.jsonl"
    cmd = [*engine_cli(), "run-batch", "-i", str(missing), "-o", "x", str(tiny_model)]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=60)
    assert done.returncode == 2 and "is not a file" in done.stderr


def test_run_batch_embeddings(tiny_model: Path, tmp_path: Path) -> None:
    src, dst = tmp_path / "emb.jsonl", tmp_path / "emb-out.jsonl"
    chat = {"custom_id": "chat", "method": "POST", "url": "/v1/chat/completions", "body": CHAT}
    lines = [
        {"custom_id": f"e{i}", "method": "POST", "url": "/v1/embeddings",
         "body": {"model": "tiny", "input": text}}
        for i, text in enumerate(["one input", ["two", "three"]])
    ] + [chat]  # fmt: skip
    src.write_text("\n".join(json.dumps(line) for line in lines) + "\n")
    flags = [f for f in SERVER_FLAGS if f != "--log-stats-interval" and f != "0"]
    cmd = [*engine_cli(), "run-batch", "-i", str(src), "-o", str(dst), str(tiny_model), *flags,
           "--served-model-name", "tiny", "--task", "embed", "--no-progress"]  # fmt: skip
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=240)
    assert done.returncode == 0, done.stderr[-3000:]
    by_id = {r["custom_id"]: r for r in map(json.loads, dst.read_text().splitlines())}
    assert len(by_id["e0"]["response"]["body"]["data"]) == 1
    two = by_id["e1"]["response"]["body"]["data"]
    assert [d["index"] for d in two] == [0, 1]
    assert abs(sum(x * x for x in two[1]["embedding"]) - 1.0) < 1e-4
    assert by_id["chat"]["response"]["status_code"] == 400  # an embedding model cannot chat
