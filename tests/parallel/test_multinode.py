"""Tensor parallelism across two "nodes" on one machine (gloo on the CPU): node 0 is a real
``engine serve --nnodes 2 --node-rank 0``, node 1 a separate ``engine serve --headless
--nnodes 2 --node-rank 1`` process group; greedy answers must be token-identical to TP=1."""

from __future__ import annotations

import socket
import subprocess
import sys
from pathlib import Path

import httpx
import pytest
from engine import LLM, SamplingParams
from engine.config import EngineArgs
from engine.errors import StartupError
from engine.executor.multinode import check_multinode, node_ranks
from engine_sdk.testing.server import ServerProcess, free_port, wait_gone

PROMPTS = ["Hello, my name is", "The capital of France is", "1 2 3 4"]
NUM_NEW = 12
FLAGS = ["--device", "cpu", "--dtype", "float32", "--block-size", "4", "--max-model-len", "128",
         "--kv-cache-memory-bytes", str(1 << 20)]  # fmt: skip


def two_free_ports() -> int:
    """A port P with P+1 free too (rendezvous and step channel)."""
    for _ in range(50):
        port = free_port()
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port + 1))
            except OSError:
                continue
        return port
    raise RuntimeError("no two consecutive free ports")


def test_node_flags_are_checked() -> None:
    ok = EngineArgs(tensor_parallel_size=4, nnodes=2, node_rank=1)
    check_multinode(ok)
    assert node_ranks(ok) == [2, 3]
    with pytest.raises(StartupError, match="does not split over --nnodes 2"):
        check_multinode(EngineArgs(tensor_parallel_size=3, nnodes=2))
    with pytest.raises(StartupError, match="--node-rank 2 is outside 0..1"):
        check_multinode(EngineArgs(tensor_parallel_size=2, nnodes=2, node_rank=2))


def test_rank_of_another_node_needs_headless() -> None:
    cmd = [sys.executable, "-m", "engine.cli.main", "serve", "x", "--node-rank", "1"]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    assert r.returncode == 2 and "add --headless" in r.stderr


@pytest.mark.timeout(600)
def test_two_nodes_match_tp1(qwen3_dir: Path) -> None:
    model = str(qwen3_dir)
    params = SamplingParams(max_tokens=NUM_NEW, temperature=0.0, ignore_eos=True)
    tp1 = LLM(model=model, device="cpu", dtype="float32", block_size=4, max_model_len=128)
    expected = [o.outputs[0].text for o in tp1.generate(PROMPTS, params)]
    del tp1

    master = two_free_ports()
    nodes = ["--tensor-parallel-size", "2", "--nnodes", "2", "--master-addr", "127.0.0.1",
             "--master-port", str(master)]  # fmt: skip
    cli = [sys.executable, "-m", "engine.cli.main", "serve", model, *FLAGS, *nodes]
    node1 = subprocess.Popen(
        [*cli, "--node-rank", "1", "--headless"],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )  # fmt: skip
    port = free_port()
    node0 = ServerProcess([*cli, "--node-rank", "0", "--port", str(port)], port)
    node0.startup_timeout_s = 300
    try:
        node0.start()
        for prompt, want in zip(PROMPTS, expected, strict=True):
            r = httpx.post(
                node0.base_url + "/v1/completions",
                json={"prompt": prompt, "max_tokens": NUM_NEW, "temperature": 0,
                      "ignore_eos": True},
                timeout=120,
            )  # fmt: skip
            assert r.status_code == 200, r.text
            assert r.json()["choices"][0]["text"] == want
            assert r.json()["usage"]["completion_tokens"] == NUM_NEW
        assert node1.poll() is None  # node 1 serves its rank until node 0 stops
        assert node0.stop() == 0
        out, _ = node1.communicate(timeout=60)
        assert node1.returncode == 0, out  # node 0's shutdown stopped node 1's rank
        assert "ranks [1]" in out
    finally:
        node0.stop()
        if node1.poll() is None:
            node1.kill()
            node1.wait()
    assert wait_gone(node1.pid, 5)
