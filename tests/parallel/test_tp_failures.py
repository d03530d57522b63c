"""Tensor-parallel failures end the engine cleanly: a killed worker makes ``generate``
raise within seconds naming the rank; a worker's exception comes back with its
traceback; workers never outlive the engine (normal exit, SIGKILL of the engine); a
script without the ``__main__`` guard gets a clear error instead of recursive starts."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from typing import Any

import pytest
from engine import LLM, SamplingParams
from engine.errors import WorkerFailedError
from engine.executor.step_codec import dumps
from tp_helpers import BASE, wait_gone

PROMPTS = ["Hello world! How are you today?", "The quick brown fox", "A", "Numbers: 0 1 2"]
LONG = SamplingParams(temperature=0.0, max_tokens=200, ignore_eos=True)


def _tp2(model_dir: Path) -> LLM:
    return LLM(model=str(model_dir), tensor_parallel_size=2, kv_cache_memory_bytes=1 << 20, **BASE)


@pytest.mark.timeout(300)
def test_worker_killed_mid_run_fails_generate_naming_the_rank(qwen3_dir: Path) -> None:
    llm = _tp2(qwen3_dir)
    pids: list[int] = [p for p in llm.engine.runner.worker_pids if p is not None]
    state: dict[str, Any] = {"steps": 0, "killed_at": None}

    def kill_rank_1_at_step_5(_: object) -> None:
        state["steps"] += 1
        if state["steps"] == 5:
            os.kill(pids[1], signal.SIGKILL)
            state["killed_at"] = time.monotonic()

    llm.engine.add_stats_listener(kill_rank_1_at_step_5)
    with pytest.raises(WorkerFailedError) as info:
        llm.generate(PROMPTS, LONG, use_tqdm=False)
    assert state["killed_at"] is not None
    assert time.monotonic() - state["killed_at"] < 10
    message = str(info.value)
    first_line = message.splitlines()[0]
    assert "rank 1" in first_line and f"pid {pids[1]}" in first_line and "SIGKILL" in first_line
    assert "restart" in message
    assert wait_gone(pids, timeout=10) == []
    # the engine stays failed: the next call raises at once instead of hanging
    start = time.monotonic()
    with pytest.raises(WorkerFailedError, match="rank 1"):
        llm.generate(["A"], LONG, use_tqdm=False)
    assert time.monotonic() - start < 2


@pytest.mark.timeout(300)
def test_worker_exception_comes_back_with_its_traceback(qwen3_dir: Path) -> None:
    llm = _tp2(qwen3_dir)
    executor = llm.engine.runner
    pids = [p for p in executor.worker_pids if p is not None]
    assert llm.generate(["A"], SamplingParams(temperature=0.0, max_tokens=3), use_tqdm=False)
    # a message rank 0 cannot handle makes it raise inside its serving loop
    executor._workers[0].conn.send_bytes(dumps({"op": "bogus"}))
    with pytest.raises(WorkerFailedError) as info:
        executor._wait_replies("step")
    message = str(info.value)
    assert message.splitlines()[0].startswith("tensor-parallel worker rank 0 failed during a step")
    assert "ValueError: unknown message op 'bogus'" in message
    assert "Traceback (most recent call last)" in message and "worker_main.py" in message
    assert wait_gone(pids, timeout=10) == []
    executor.shutdown()  # idempotent after a failure


_GUARDED = """
import sys, time
from engine import LLM, SamplingParams

def main():
    llm = LLM(model=sys.argv[1], tensor_parallel_size=2, device="cpu", dtype="float32",
              block_size=4, kv_cache_memory_bytes=1 << 20)
    out = llm.generate(["Hello"], SamplingParams(temperature=0.0, max_tokens=4), use_tqdm=False)
    assert len(out[0].outputs[0].token_ids) == 4
    print("PIDS", *llm.engine.runner.worker_pids, flush=True)
    if sys.argv[2] == "hang":
        time.sleep(600)

if __name__ == "__main__":
    main()
"""

_UNGUARDED = """
import sys
from engine import LLM

llm = LLM(model=sys.argv[1], tensor_parallel_size=2, device="cpu", dtype="float32",
          block_size=4, kv_cache_memory_bytes=1 << 20)
print("STARTED", flush=True)
"""


def _script(tmp_path: Path, name: str, text: str) -> str:
    path = tmp_path / name
    path.write_text(textwrap.dedent(text))
    return str(path)


def _pids(line: str) -> list[int]:
    assert line.startswith("PIDS "), line
    return [int(p) for p in line.split()[1:]]


@pytest.mark.timeout(300)
def test_no_worker_outlives_a_normal_exit(tmp_path: Path, qwen3_dir: Path) -> None:
    script = _script(tmp_path, "guarded.py", _GUARDED)
    done = subprocess.run(
        [sys.executable, script, str(qwen3_dir), "exit"],
        capture_output=True,
        text=True,
        timeout=240,
        cwd=tmp_path,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    line = [ln for ln in done.stdout.splitlines() if ln.startswith("PIDS")][0]
    assert wait_gone(_pids(line), timeout=10) == []


@pytest.mark.timeout(300)
def test_no_worker_outlives_a_killed_engine(tmp_path: Path, qwen3_dir: Path) -> None:
    script = _script(tmp_path, "guarded.py", _GUARDED)
    proc = subprocess.Popen(
        [sys.executable, script, str(qwen3_dir), "hang"],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
        cwd=tmp_path,
    )
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()
        pids = _pids(line)
        assert len(pids) == 2
        proc.kill()  # SIGKILL: no atexit, no finalizers run in the engine
        proc.wait(10)
        assert wait_gone(pids, timeout=15) == []
    finally:
        proc.kill()
        proc.wait()


@pytest.mark.timeout(300)
def test_script_without_main_guard_gets_a_clear_error(tmp_path: Path, qwen3_dir: Path) -> None:
    script = _script(tmp_path, "unguarded.py", _UNGUARDED)
    done = subprocess.run(
        [sys.executable, script, str(qwen3_dir)],
        capture_output=True,
        text=True,
        timeout=240,
        cwd=tmp_path,
    )
    assert done.returncode != 0
    assert "STARTED" not in done.stdout
    assert 'if __name__ == "__main__":' in done.stderr
    assert "StartupError" in done.stderr
