"""Grammar compiles run in killable, memory-capped worker processes (issue 17 item 1).

A compile past ``compile_timeout_s`` gets its worker SIGKILLed and replaced; one needing
more than ``compile_memory_bytes`` fails inside its worker (``RLIMIT_AS``), which is
replaced too. Either way the request gets a ``RequestValidationError`` (a 400) naming the
flag, repeats are refused without compiling again, and the next constraint compiles.
"""

from __future__ import annotations

import os
import time
from typing import Any

import engine_outlines.plugin
import pytest
from engine.errors import RequestValidationError
from engine.sampling_params import StructuredOutputsParams as Params
from structured_output_fakes import ManagerFactory, sleepy_plugin

pytestmark = pytest.mark.timeout(300)

# 2^15 DFA states: ~8 s and ~1 GB to compile even over the tiny test vocabulary.
RUNAWAY_REGEX = ".*a.{14}"
SCHEMA = {"type": "object", "properties": {"n": {"type": "integer"}}, "required": ["n"]}


def _ready(manager: Any) -> Any:
    manager.warmup().result(timeout=120)
    return manager


def _gone(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(") ", 1)[1].startswith("Z")  # a zombie is gone too
    except FileNotFoundError:
        return True


def _wait_replaced(manager: Any, old_pid: int, timeout_s: float = 120.0) -> int:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        pids = [p for p in manager.worker_pids() if p is not None]
        if pids and old_pid not in pids:
            return int(pids[0])
        time.sleep(0.05)
    raise AssertionError(f"worker {old_pid} was not replaced: {manager.worker_pids()}")


def test_timeout_kills_the_worker_and_a_new_one_serves_the_next_request(
    make_manager: ManagerFactory,
) -> None:
    manager = _ready(make_manager(sleepy_plugin(), num_compile_workers=1, compile_timeout_s=1))
    [old_pid] = manager.worker_pids()
    start = time.monotonic()
    with pytest.raises(RequestValidationError, match="took longer than 1 s") as info:
        manager.compile(Params(regex="sleep:600"))
    assert time.monotonic() - start < 3.0
    assert "compile-timeout-s" in str(info.value)
    deadline = time.monotonic() + 5
    while not _gone(old_pid) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert _gone(old_pid), "the timed-out compile kept running"
    new_pid = _wait_replaced(manager, old_pid)
    grammar = manager.compile(Params(regex="sleep:0"), timeout_s=60)
    assert grammar.pid == new_pid != os.getpid()
    # A repeat of the runaway constraint is refused at once, without compiling again.
    start = time.monotonic()
    with pytest.raises(RequestValidationError, match="took longer than"):
        manager.compile(Params(regex="sleep:600"))
    assert time.monotonic() - start < 0.5
    assert manager.num_compiles == 2


def test_memory_cap_stops_a_compile_and_the_worker_is_replaced(
    make_manager: ManagerFactory,
) -> None:
    manager = _ready(
        make_manager(sleepy_plugin(), num_compile_workers=1, compile_memory_bytes=256 << 20)
    )
    [old_pid] = manager.worker_pids()
    with pytest.raises(RequestValidationError, match="needed more than 268435456 bytes") as info:
        manager.compile(Params(regex=f"alloc:{2 << 30}"), timeout_s=60)
    assert "compile-memory-bytes" in str(info.value)
    new_pid = _wait_replaced(manager, old_pid)
    assert manager.compile(Params(regex=f"alloc:{16 << 20}"), timeout_s=60).pid == new_pid


def test_memory_cap_stops_a_runaway_native_compile(make_manager: ManagerFactory) -> None:
    manager = _ready(
        make_manager(engine_outlines.plugin, compile_memory_bytes=192 << 20, compile_timeout_s=120)
    )
    rss_before = _rss_bytes(os.getpid())
    start = time.monotonic()
    with pytest.raises(RequestValidationError, match="needed more than"):
        manager.compile(Params(regex=RUNAWAY_REGEX))
    assert time.monotonic() - start < 60
    assert _rss_bytes(os.getpid()) - rss_before < 100 << 20  # nothing built in this process
    grammar = manager.compile(Params(json=SCHEMA), timeout_s=60)
    assert grammar.new_matcher().allowed_token_ids().any()


def test_runaway_native_compile_is_killed_at_the_deadline(make_manager: ManagerFactory) -> None:
    manager = _ready(make_manager(engine_outlines.plugin, compile_timeout_s=1))
    pids = set(manager.worker_pids())
    start = time.monotonic()
    with pytest.raises(RequestValidationError, match="took longer than 1 s"):
        manager.compile(Params(regex=RUNAWAY_REGEX))
    assert time.monotonic() - start < 3.0
    assert manager.compile(Params(json=SCHEMA), timeout_s=60).new_matcher() is not None
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and len(set(manager.worker_pids()) - pids) < 1:
        time.sleep(0.05)
    assert len(set(manager.worker_pids()) - pids) == 1, "the killed worker was not replaced"


def test_a_cached_grammar_is_not_recompiled(make_manager: ManagerFactory) -> None:
    manager = _ready(make_manager(engine_outlines.plugin))
    first = manager.compile(Params(json=SCHEMA), timeout_s=60)
    start = time.monotonic()
    again = manager.compile(Params(json=dict(reversed(list(SCHEMA.items())))), timeout_s=60)
    assert again is first
    assert time.monotonic() - start < 0.05
    assert manager.num_compiles == 1


def test_validate_never_compiles_nor_starts_workers(make_manager: ManagerFactory) -> None:
    """What an API server process runs: cheap checks, no workers, no vocabulary."""
    manager = make_manager(engine_outlines.plugin)
    start = time.monotonic()
    manager.validate(Params(regex=RUNAWAY_REGEX))  # bounds cannot see this one
    manager.validate(Params(json=SCHEMA))
    with pytest.raises(RequestValidationError, match="1000000 repetitions"):
        manager.validate(Params(regex="a{1000}{1000}"))
    assert time.monotonic() - start < 0.1
    assert manager.worker_pids() == []
    assert manager.num_compiles == 0


def _rss_bytes(pid: int) -> int:
    with open(f"/proc/{pid}/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def test_limits_come_from_the_flags_the_config_file_and_engine_args(
    tmp_path: Any, tiny_tokenizer: Any
) -> None:
    from engine.cli.serve_args import parse_serve_args
    from engine.config import EngineArgs
    from engine.structured_output.setup import build_structured_output_manager
    from structured_output_fakes import load_pm

    parsed = parse_serve_args(
        [
            "m", "--structured-outputs-config.compile-timeout-s", "2.5",
            "--structured-outputs-config.compile-memory-bytes", str(512 << 20),
        ]
    )  # fmt: skip
    assert not isinstance(parsed, str)
    assert parsed.engine_args.structured_outputs_compile_timeout_s == 2.5
    assert parsed.engine_args.structured_outputs_compile_memory_bytes == 512 << 20
    config = tmp_path / "c.yaml"
    config.write_text("structured_outputs_config:\n  compile_timeout_s: 7\n")
    parsed = parse_serve_args(["m", "--config", str(config)])
    assert not isinstance(parsed, str)
    assert parsed.engine_args.structured_outputs_compile_timeout_s == 7
    assert parsed.engine_args.structured_outputs_compile_memory_bytes == 4 << 30  # default

    args = EngineArgs.from_kwargs(  # what LLM(...) builds from its keywords
        model="m",
        structured_outputs_compile_timeout_s=4,
        structured_outputs_compile_memory_bytes=1 << 30,
    )
    pm = load_pm(engine_outlines.plugin)
    manager = build_structured_output_manager(args, pm, tiny_tokenizer, len(tiny_tokenizer), [0])
    assert manager is not None
    assert (manager.config.compile_timeout_s, manager.config.compile_memory_bytes) == (4, 1 << 30)
    assert manager.worker_pids() == []  # nothing started until the engine warms it up
    manager.close()
