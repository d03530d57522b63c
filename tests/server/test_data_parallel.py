"""``--data-parallel-size``: the balancing rules, and a real ``engine serve`` with two engine
processes on the CPU (prefix affinity, overflow to the idle engine, identical answers, a
clean SIGTERM)."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest

# Module level: `conftest` names this directory's conftest only while it is collected.
from conftest import REAL_SERVER_FLAGS, ServerProcess, engine_cli, free_port
from conftest import real_engine_available as available
from engine.data_parallel import (
    AFFINITY_SLACK,
    choose_engine,
    device_groups,
    load_score,
    prefix_key,
    sum_stats,
)
from engine.outputs import SchedulerStats
from engine_sdk.testing.server import child_pids, process_cmdline, wait_gone

LONG_PREFIX = "You are a careful assistant. Answer in one short sentence. " * 6  # > 256 chars


def stats(running: int, waiting: int, usage: float = 0.0, total: int = 100) -> SchedulerStats:
    return SchedulerStats(running, waiting, usage, 1, 10, 4, total - int(usage * total), total)


def test_prefix_key_depends_on_the_start_and_the_salt_only() -> None:
    assert prefix_key(LONG_PREFIX + "a", None) == prefix_key(LONG_PREFIX + "b", None)
    assert prefix_key(LONG_PREFIX, None) != prefix_key(LONG_PREFIX, "tenant-1")
    assert prefix_key("short a", None) != prefix_key("short b", None)
    ids = list(range(100))
    assert prefix_key(ids, None) == prefix_key([*ids, 7], None)
    assert prefix_key({"prompt_token_ids": ids}, None) == prefix_key(ids, None)


def test_affinity_until_the_preferred_engine_is_too_busy() -> None:
    key = 3  # prefers engine 1 of 2
    assert choose_engine(key, [0.0, 0.0]) == 1
    assert choose_engine(key, [0.0, AFFINITY_SLACK]) == 1
    assert choose_engine(key, [0.0, AFFINITY_SLACK + 0.5]) == 0
    # a queued request weighs more than a running one; KV use breaks ties
    assert load_score(stats(2, 0), 0) < load_score(stats(1, 1), 0)
    assert load_score(stats(1, 0, usage=0.5), 0) > load_score(stats(1, 0), 0)
    assert load_score(stats(0, 0), 3) == 3  # this server's requests not yet in a step


def test_sum_stats_weights_kv_use_by_blocks() -> None:
    total = sum_stats([stats(1, 2, usage=0.5, total=100), stats(3, 0, usage=0.0, total=300)])
    assert (total.num_running, total.num_waiting, total.num_total_blocks) == (4, 2, 400)
    assert total.kv_cache_usage == pytest.approx(50 / 400)
    assert total.prefix_cache_hits == 8


def test_device_groups_split_the_visible_gpus() -> None:
    assert device_groups(2, 1, "cpu", []) == [{}, {}]
    groups = device_groups(2, 2, "cuda", ["4", "5", "6", "7"])
    assert groups == [{"CUDA_VISIBLE_DEVICES": "4,5"}, {"CUDA_VISIBLE_DEVICES": "6,7"}]
    with pytest.raises(ValueError, match="needs 4 GPUs; 3 are visible .* to 1"):
        device_groups(2, 2, "cuda", ["0", "1", "2"])
    with pytest.raises(ValueError, match="drop --device cuda:1"):
        device_groups(2, 1, "cuda:1", ["0", "1"])


def test_data_parallel_needs_the_engine_process() -> None:
    from engine.cli.serve_args import UsageError, parse_serve_args

    with pytest.raises(UsageError, match="--data-parallel-size 2 runs engine processes"):
        parse_serve_args(["--data-parallel-size", "2", "--no-engine-process"])


# -- a real server with two engine processes ----------------------------------------------------


@pytest.fixture(scope="module")
def dp_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    if not available():
        pytest.skip("needs the real engine")
    from engine_sdk.testing.models import build_tiny_model

    model = build_tiny_model(tmp_path_factory.mktemp("tiny-dp"), "Qwen3ForCausalLM")
    port = free_port()
    cmd = [*engine_cli(), "serve", str(model), "--port", str(port), *REAL_SERVER_FLAGS]
    cmd += ["--data-parallel-size", "2", "--max-model-len", "512"]
    srv = ServerProcess(cmd, port).start()
    yield srv
    srv.stop()


def engine_loads(srv: ServerProcess) -> list[dict[str, Any]]:
    loads: list[dict[str, Any]] = httpx.get(srv.base_url + "/load").json()["engines"]
    return loads


def added(srv: ServerProcess) -> list[int]:
    return [e["num_requests_added"] for e in engine_loads(srv)]


@pytest.mark.timeout(240)
def test_two_engines_affinity_overflow_and_equal_answers(dp_server: ServerProcess) -> None:
    srv = dp_server
    assert httpx.get(srv.base_url + "/ready").status_code == 200
    assert [e["engine"] for e in engine_loads(srv)] == [0, 1]
    client = openai.OpenAI(base_url=srv.base_url + "/v1", api_key="none")

    # one after another, a shared prefix goes to one engine (its blocks are cached there)
    before = added(srv)
    for tail in ("first question", "second question", "third question"):
        client.completions.create(
            model="tiny", prompt=LONG_PREFIX + tail, max_tokens=3, temperature=0
        )
    delta = [a - b for a, b in zip(added(srv), before, strict=True)]
    assert sorted(delta) == [0, 3], delta
    preferred = delta.index(3)
    assert engine_loads(srv)[preferred]["prefix_cache_hits"] > 0

    # at once, the same prefix overflows to the idle engine once the preferred is too busy
    before = added(srv)
    texts: list[str] = []
    lock = threading.Lock()

    def ask() -> None:
        r = client.completions.create(
            model="tiny", prompt=LONG_PREFIX + "again", max_tokens=120, temperature=0,
            extra_body={"ignore_eos": True},
        )  # fmt: skip
        with lock:
            texts.append(r.choices[0].text)

    threads = [threading.Thread(target=ask) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    delta = [a - b for a, b in zip(added(srv), before, strict=True)]
    assert sum(delta) == 8 and min(delta) > 0, delta
    assert delta[preferred] >= AFFINITY_SLACK + 1, delta
    assert len(texts) == 8 and len(set(texts)) == 1  # both engines answer alike (greedy)


@pytest.mark.timeout(240)
def test_sigterm_stops_every_engine_process(tmp_path: Path) -> None:
    if not available():
        pytest.skip("needs the real engine")
    from engine_sdk.testing.models import build_tiny_model

    model = build_tiny_model(tmp_path / "tiny", "Qwen3ForCausalLM")
    port = free_port()
    cmd = [*engine_cli(), "serve", str(model), "--port", str(port), *REAL_SERVER_FLAGS]
    srv = ServerProcess([*cmd, "--data-parallel-size", "2"], port).start()
    assert srv.proc is not None
    kids = child_pids(srv.proc.pid)
    names = [process_cmdline(pid) for pid in kids]
    assert sum("spawn" in name for name in names) >= 3, names  # 2 engines + 1 API server
    assert srv.stop() == 0
    assert all(wait_gone(pid, 15) for pid in kids)
