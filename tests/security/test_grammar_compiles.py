"""Runaway grammar compiles against a real ``engine serve`` (issue 17 item 1).

Hostile constraints get a 400: the over-bound ones at once (in the API server, which only
validates), the ones whose automaton explodes (``.*a.{14}``: small counts, 2^15 states)
when the compile deadline kills their worker in the engine process. Meanwhile ``/health``
answers within a second, the server's process tree does not keep the memory the compiles
took, the API server process never compiles, and constrained requests work afterwards.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from engine_sdk.testing.server import child_pids, process_cmdline
from sec_helpers import Server, free_port, serve_cmd

pytestmark = pytest.mark.timeout(300)

COMPILE_TIMEOUT_S = 3.0
MARGIN_S = 3.0  # killing the worker and answering, on a busy two-core machine
RUNAWAY = [".*a.{14}", ".*b.{14}", ".*c.{14}"]  # three, for two compile workers
OVER_BOUND = [
    {"regex": "a{1000}{1000}"},
    {"json": {"type": "array", "items": {"type": "integer"}, "minItems": 1000,
              "maxItems": 1000000}},
    {"json": {"type": "object", "properties": {"s": {"type": "string", "minLength": 100000}}}},
]  # fmt: skip
SCHEMA = {"type": "object", "properties": {"n": {"type": "integer"}}, "required": ["n"]}


@pytest.fixture(scope="module")
def grammar_server(tiny_model: Path) -> Iterator[Server]:
    port = free_port()
    cmd = serve_cmd(
        tiny_model, port,
        "--structured-outputs-config.compile-timeout-s", str(COMPILE_TIMEOUT_S),
        "--structured-outputs-config.compile-memory-bytes", str(1 << 30),
    )  # fmt: skip
    server = Server(cmd, port).start()
    try:
        _constrained(server, {"json": SCHEMA})  # the engine's compile workers are up
        yield server
    finally:
        server.stop()


def _constrained(server: Server, structured: dict[str, Any]) -> httpx.Response:
    body = {"model": "tiny", "prompt": "hi", "max_tokens": 4, "structured_outputs": structured}
    return httpx.post(
        server.base_url + "/v1/completions", json=body, headers=server.headers, timeout=120
    )


def _assert_over_bound_refused_at_once(server: Server) -> None:
    """Every ``OVER_BOUND`` constraint gets a 400 naming the limit within a second."""
    for structured in OVER_BOUND:
        start = time.monotonic()
        r = _constrained(server, structured)
        assert r.status_code == 400, r.text
        assert "repetitions, over the limit" in r.json()["error"]["message"]
        assert time.monotonic() - start < 1.0


def _tree(pid: int) -> list[int]:
    pids, i = [pid], 0
    while i < len(pids):
        pids.extend(child_pids(pids[i]))
        i += 1
    return pids


def _rss(pid: int) -> int:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    except (FileNotFoundError, ProcessLookupError):
        pass
    return 0


def _tree_rss(pid: int) -> int:
    return sum(_rss(p) for p in _tree(pid))


class _HealthProbe(threading.Thread):
    """GET /health every 100 ms; the slowest answer (or None: no answer within 5 s)."""

    def __init__(self, server: Server) -> None:
        super().__init__(daemon=True)
        self.server, self.stop_event = server, threading.Event()
        self.latencies: list[float | None] = []

    def run(self) -> None:
        with httpx.Client(timeout=5) as client:
            while not self.stop_event.is_set():
                start = time.monotonic()
                try:
                    ok = client.get(self.server.base_url + "/health").status_code == 200
                except httpx.HTTPError:
                    ok = False
                self.latencies.append(time.monotonic() - start if ok else None)
                self.stop_event.wait(0.1)


def test_hostile_grammars_are_refused_and_the_server_stays_responsive(
    grammar_server: Server,
) -> None:
    assert grammar_server.proc is not None
    api_pid = grammar_server.proc.pid
    api_rss_before = _rss(api_pid)
    tree_before = _tree_rss(api_pid)
    # One plain request first: a fresh server's first completion sometimes takes ~3 s (seen
    # on the 2-core machine, cause not found), which is not what the timings below measure.
    warm = httpx.post(
        grammar_server.base_url + "/v1/completions", headers=grammar_server.headers,
        json={"model": "tiny", "prompt": "hi", "max_tokens": 1}, timeout=120,
    )  # fmt: skip
    assert warm.status_code == 200, warm.text
    # Over-bound constraints on a quiet server: a 400 from the API server at once.
    _assert_over_bound_refused_at_once(grammar_server)
    probe = _HealthProbe(grammar_server)
    probe.start()
    results: dict[str, tuple[int, str, float]] = {}
    peak = [0]

    def send(regex: str) -> None:
        start = time.monotonic()
        r = _constrained(grammar_server, {"regex": regex})
        results[regex] = (r.status_code, r.text, time.monotonic() - start)

    threads = [threading.Thread(target=send, args=(regex,)) for regex in RUNAWAY]
    for thread in threads:
        thread.start()
    while any(t.is_alive() for t in threads):
        peak[0] = max(peak[0], _tree_rss(api_pid))
        time.sleep(0.1)
    # Over-bound constraints right after the runaway ones: still refused by the bounds.
    _assert_over_bound_refused_at_once(grammar_server)
    probe.stop_event.set()
    probe.join()

    for regex, (status, text, elapsed) in results.items():
        assert status == 400, (regex, text)
        message = httpx.Response(400, content=text).json()["error"]["message"]
        assert "took longer than 3 s" in message or "needed more than" in message, message
        for internal in ("outlines", "Index", "Traceback", "RLIMIT", "MemoryError"):
            assert internal not in message, message
        assert elapsed < COMPILE_TIMEOUT_S + MARGIN_S, (regex, elapsed)
    answered = [lat for lat in probe.latencies if lat is not None]
    assert len(answered) == len(probe.latencies), "a /health probe got no answer"
    assert max(answered) < 1.0, f"/health took {max(answered):.2f} s"
    assert _rss(api_pid) - api_rss_before < 64 << 20, "the API server process compiled"
    # The compile workers belong to the engine process: the API server has none.
    # (killed workers are replaced by fresh ones: wait for both, up to 5 s)
    deadline = time.monotonic() + 5.0
    while True:
        workers = [p for p in _tree(api_pid) if "compile_worker" in process_cmdline(p)]
        if len(workers) >= 2 or time.monotonic() > deadline:
            break
        time.sleep(0.1)
    assert len(workers) == 2, [process_cmdline(p) for p in _tree(api_pid)]
    assert not set(workers) & set(child_pids(api_pid))
    time.sleep(1.0)  # the fresh workers have settled
    growth = _tree_rss(api_pid) - tree_before
    assert growth < 256 << 20, f"the server tree kept {growth >> 20} MiB"
    print(
        f"runaway: {[round(r[2], 2) for r in results.values()]} s; /health max "
        f"{max(answered) * 1000:.0f} ms over {len(answered)} probes; tree RSS "
        f"{tree_before >> 20} -> peak {peak[0] >> 20} -> {_tree_rss(api_pid) >> 20} MiB"
    )

    # A repeat is refused without compiling again; normal constraints still work. With
    # three runaway compiles on two workers, one of them may have waited past its
    # deadline without starting: it was never compiled, so it is not on the refused list
    # and its repeat compiles (which of the three is a race). The two that ran are.
    fast = 0
    for regex in RUNAWAY:
        start = time.monotonic()
        r = _constrained(grammar_server, {"regex": regex})
        assert r.status_code == 400, r.text
        fast += time.monotonic() - start < 1.0
    assert fast >= 2, f"{fast} of the runaway regexes were refused at once on repeat"
    body = {
        "model": "tiny",
        "messages": [{"role": "user", "content": "hi"}],
        "max_tokens": 4,
        "response_format": {"type": "json_schema", "json_schema": {"name": "n", "schema": SCHEMA}},
    }
    start = time.monotonic()
    r = httpx.post(
        grammar_server.base_url + "/v1/chat/completions",
        json=body,
        headers=grammar_server.headers,
        timeout=120,
    )
    assert r.status_code == 200, r.text
    print(f"normal json_schema request after the runaway ones: {time.monotonic() - start:.2f} s")
