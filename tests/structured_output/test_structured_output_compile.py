"""Compiling through the manager: errors, canonical keys, off-process work, deadlines."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import engine_outlines.plugin
import pytest
from engine.errors import RequestValidationError
from engine.sampling_params import StructuredOutputsParams as Params
from structured_output_fakes import ManagerFactory, sleepy_plugin

# An exponential DFA: "an 'a' 15 letters before the end" needs 2^15 states.
PATHOLOGICAL_REGEX = "[a-z]*a[a-z]{15}"


def _sleepy_manager(make_manager: ManagerFactory, **config: object) -> Any:
    manager = make_manager(sleepy_plugin(), **config)
    manager.warmup().result(timeout=120)  # the workers are up: timings measure compiles
    return manager


@pytest.mark.parametrize(
    ("params", "message"),
    [
        (Params(json={"type": "objekt"}), "structured_outputs.json: invalid JSON schema at type"),
        (
            Params(json="{'single': 'quotes'}"),
            "structured_outputs.json: the JSON schema is not valid",
        ),
        (Params(json={"type": "string", "pattern": "(?<=x)y"}), "structured_outputs.json: "),
        (Params(regex="[a-z"), "structured_outputs.regex: cannot compile the regex"),
        (Params(regex=r"(\w)\1"), "structured_outputs.regex: cannot compile the regex"),
        (Params(choice=[]), "structured_outputs.choice: must be a non-empty list"),
        (Params(grammar='root ::= "x"'), "grammar is not supported by this server"),
        (Params(regex="a", choice=["a"]), "needs exactly one of"),
        (Params(), "needs exactly one of"),
    ],
)
def test_invalid_constraints_are_request_errors(
    make_manager: ManagerFactory, params: Params, message: str
) -> None:
    manager = make_manager()
    future = manager.compile_async(params)
    with pytest.raises(RequestValidationError, match=message.replace("(", r"\(")):
        future.result(timeout=30)
    assert len(manager.cache) == 0


def test_oversized_spec_is_refused(make_manager: ManagerFactory) -> None:
    manager = make_manager(max_spec_chars=100)
    with pytest.raises(RequestValidationError, match="over the limit of 100"):
        manager.compile(Params(regex="a" * 101))


def test_equivalent_specs_share_one_grammar(make_manager: ManagerFactory) -> None:
    manager = make_manager()
    schema = {"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]}
    reordered = {"required": ["a"], "properties": {"a": {"type": "integer"}}, "type": "object"}
    first = manager.compile(Params(json=schema))
    assert manager.compile(Params(json=reordered)) is first
    assert manager.compile(Params(json=json.dumps(schema, indent=2))) is first
    assert len(manager.cache) == 1
    assert manager.cache.num_hits == 2


def test_compile_runs_in_another_process(make_manager: ManagerFactory) -> None:
    manager = _sleepy_manager(make_manager)
    start = time.monotonic()
    future = manager.compile_async(Params(regex="sleep:0.5"))
    assert time.monotonic() - start < 0.1, "compile_async blocked the caller"
    assert not future.done()
    num_loops = 0
    while not future.done():  # the engine loop keeps stepping meanwhile
        num_loops += 1
        time.sleep(0.01)
    assert num_loops >= 10
    grammar = future.result()
    assert grammar.spec == "sleep:0.5"
    assert grammar.pid != os.getpid()
    assert grammar.pid in manager.worker_pids()


def test_concurrent_requests_for_one_key_compile_once(make_manager: ManagerFactory) -> None:
    manager = _sleepy_manager(make_manager)
    futures = [manager.compile_async(Params(regex="sleep:0.3")) for _ in range(5)]
    grammars = {id(f.result(timeout=10)) for f in futures}
    assert len(grammars) == 1
    assert manager.num_compiles == 1
    assert manager.num_in_flight() == 0


def test_deadline_fails_the_request_and_manager_stays_usable(make_manager: ManagerFactory) -> None:
    manager = _sleepy_manager(make_manager)
    start = time.monotonic()
    slow = manager.compile_async(Params(regex="sleep:2"), timeout_s=0.2)
    with pytest.raises(RequestValidationError, match=r"took longer than 0.2 s"):
        slow.result(timeout=5)
    assert time.monotonic() - start < 1.5
    # The other worker serves the next request while the slow compile finishes.
    assert manager.compile(Params(regex="sleep:0"), timeout_s=5).spec == "sleep:0"
    # The slow compile still completes in the background and is cached for next time.
    deadline = time.monotonic() + 5
    while manager.num_in_flight() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert manager.compile(Params(regex="sleep:2"), timeout_s=0.1).spec == "sleep:2"


def test_queued_compile_of_expired_callers_is_skipped(make_manager: ManagerFactory) -> None:
    manager = _sleepy_manager(make_manager, num_compile_workers=1)
    busy = manager.compile_async(Params(regex="sleep:0.6"))
    expired = manager.compile_async(Params(regex="sleep:0.01"), timeout_s=0.1)
    with pytest.raises(RequestValidationError, match="took longer than"):
        expired.result(timeout=5)
    busy.result(timeout=5)
    time.sleep(0.1)
    assert manager.num_compiles == 1, "expired job still ran"
    # Asking again starts a fresh compile.
    assert manager.compile(Params(regex="sleep:0.01"), timeout_s=5).spec == "sleep:0.01"


def test_pathological_regex_hits_the_deadline(make_manager: ManagerFactory) -> None:
    manager = make_manager(engine_outlines.plugin)
    manager.compile(Params(regex="warm"))  # build the vocabulary and the workers first
    start = time.monotonic()
    with pytest.raises(
        RequestValidationError,
        match="structured_outputs.regex: compiling the constraint took longer than",
    ):
        manager.compile(Params(regex=PATHOLOGICAL_REGEX), timeout_s=0.2)
    assert time.monotonic() - start < 1.0
    grammar = manager.compile(Params(choice=["red", "green"]), timeout_s=10)
    assert grammar.new_matcher().allowed_token_ids().any()


def test_warmup_builds_the_backend_and_precompiles(make_manager: ManagerFactory) -> None:
    manager = make_manager()
    future = manager.warmup([Params(json_object=True)])
    assert future.result(timeout=120) is None
    assert type(manager.get_backend()).__name__ == "OutlinesBackend"
    assert all(pid is not None for pid in manager.worker_pids())
    assert len(manager.cache) == 1
    manager.compile(Params(json_object=True), timeout_s=0.5)
    assert manager.cache.num_hits == 1


def test_nothing_is_written_to_disk(tmp_path: Path) -> None:
    """Compiling leaves HOME and the cache folders empty, and never imports ``outlines``
    (the package whose generators keep a disk cache; outlines-core has none)."""
    home = tmp_path / "home"
    home.mkdir()
    script = f"""
import sys
sys.path.insert(0, {str(Path(__file__).parent)!r})
from structured_output_fakes import load_pm
import engine_outlines.plugin
from engine_sdk.testing.models import build_tiny_tokenizer
from engine.structured_output import StructuredOutputManager
from engine.sampling_params import StructuredOutputsParams
tok = build_tiny_tokenizer(__import__("pathlib").Path({str(tmp_path / "tok")!r}))
manager = StructuredOutputManager(tok, len(tok), load_pm(engine_outlines.plugin))
manager.compile(StructuredOutputsParams(json={{"type": "object"}}))
manager.compile(StructuredOutputsParams(regex="[0-9]+"))
assert "outlines" not in sys.modules, "the outlines package was imported"
print("ok")
"""
    env = {
        **os.environ,
        "HOME": str(home),
        "XDG_CACHE_HOME": str(home / ".cache"),
        "OUTLINES_CACHE_DIR": str(home / "outlines"),
        "HF_HOME": str(tmp_path / "hf"),
    }
    result = subprocess.run(
        [sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=300
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip().endswith("ok")
    assert list(home.rglob("*")) == [], list(home.rglob("*"))
