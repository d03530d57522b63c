"""The engine process's loop with several clients (one per API server): each client gets
only its own requests' updates but every step's stats; an id already running for another
client is refused; a client that leaves has its requests aborted; the loop ends when the
last client has gone."""

from __future__ import annotations

import multiprocessing
import threading
import time
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any

import pytest
from engine.engine_process import _EngineLoop
from engine.outputs import CompletionOutput, RequestOutput

pytestmark = pytest.mark.timeout(60)


@dataclass
class FakeEngine:
    """Each running request gets one token per step and finishes after ``length``."""

    length: int = 3
    running: dict[str, int] = field(default_factory=dict)
    aborted: list[str] = field(default_factory=list)
    steps: int = 0

    def add_stats_listener(self, listener: Any) -> None:
        self.listener = listener

    def has_unfinished_requests(self) -> bool:
        return bool(self.running)

    def add_prepared_request(self, prepared: Any) -> None:
        self.running[prepared.request_id] = 0

    def abort_request(self, ids: list[str]) -> list[RequestOutput]:
        gone = [rid for rid in ids if self.running.pop(rid, None) is not None]
        self.aborted += gone
        return [_output(rid, 0, "abort") for rid in gone]

    def step(self) -> list[RequestOutput]:
        self.steps += 1
        self.listener(SimpleNamespace(step=self.steps))
        outs = []
        for rid in list(self.running):
            self.running[rid] += 1
            done = self.running[rid] >= self.length
            outs.append(_output(rid, self.running[rid], "length" if done else None))
            if done:
                del self.running[rid]
        return outs

    def stats(self) -> dict[str, int]:
        return {"num_running": len(self.running)}

    def counters(self) -> dict[str, int]:
        return {"steps": self.steps}


def _output(rid: str, n: int, finish: str | None) -> RequestOutput:
    c = CompletionOutput(0, "", [], finish, None, None, f"t{n}", [n], None)
    return RequestOutput(rid, "p", [1], [c], finish is not None, None, 0, None)


def _add(rid: str) -> tuple[str, Any]:
    params = SimpleNamespace(structured_outputs=None, output_kind=None)
    return ("add", SimpleNamespace(request_id=rid, params=params, core_requests=[]))


class _Reader:
    """Reads one client's pipe on a thread from the start, as an API server's reader thread
    does: the loop sends every client every step's stats, so a client whose pipe nobody
    reads (the test waiting on the other client) fills it and blocks the loop's send."""

    def __init__(self, conn: Any) -> None:
        self.msgs: list[tuple[Any, ...]] = []
        self._changed = threading.Condition()
        self._conn = conn
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        try:
            while True:
                msg = self._conn.recv()
                with self._changed:
                    self.msgs.append(msg)
                    self._changed.notify_all()
        except (EOFError, OSError):
            return

    def until(self, want: Any) -> list[tuple[Any, ...]]:
        """Every message so far, once ``want`` holds for them (10 s without a new one fails)."""
        with self._changed:
            while not want(self.msgs):
                assert self._changed.wait(10), f"no message; had {self.msgs}"
            return list(self.msgs)


def _finished(msgs: list[tuple[Any, ...]]) -> set[str]:
    return {u[0] for m in msgs if m[0] == "step" for u in m[1] if u[1]}


def test_two_clients_get_their_own_updates_and_all_stats() -> None:
    engine = FakeEngine(length=10_000)  # runs until aborted: the duplicate meets it running
    (a, a_child), (b, b_child) = multiprocessing.Pipe(), multiprocessing.Pipe()
    loop = threading.Thread(target=_EngineLoop(engine, [a_child, b_child]).run, daemon=True)
    loop.start()
    reader_a, reader_b = _Reader(a), _Reader(b)
    a.send(_add("r1"))
    # r1 has run a step (its stats reached a) before anything else happens
    msgs_a = reader_a.until(lambda ms: any(m[0] == "step" and m[1] for m in ms))
    assert msgs_a[0] == ("added", "r1", None)
    b.send(_add("r2"))
    b.send(_add("r1"))  # already running for client a
    msgs_b = reader_b.until(lambda ms: any(m[0] == "added" and m[1] == "r1" for m in ms))
    refused = [m for m in msgs_b if m[0] == "added" and m[1] == "r1"]
    assert refused[0][2][0] == "invalid_request", msgs_b
    a.send(("abort", ["r1", "r2"]))  # r2 is not a's: only r1 ends
    msgs_a = reader_a.until(lambda ms: "r1" in _finished(ms))
    steps_a = [it.step for m in msgs_a if m[0] == "step" for it in m[4]]
    ids_a = {u[0] for m in msgs_a if m[0] == "step" for u in m[1]}
    b.send(("abort", ["r2"]))
    msgs_b = reader_b.until(lambda ms: "r2" in _finished(ms))
    ids_b = {u[0] for m in msgs_b if m[0] == "step" for u in m[1]}
    assert ids_a == {"r1"} and ids_b == {"r2"}
    assert ("added", "r2", None) in msgs_b
    assert engine.aborted == ["r1", "r2"]
    # Each client sees every step's iteration stats from the first step on, including
    # steps that carried none of its own tokens.
    steps_b = [it.step for m in msgs_b if m[0] == "step" for it in m[4]]
    assert steps_a and steps_a == list(range(1, len(steps_a) + 1))
    assert steps_b and steps_b == list(range(1, len(steps_b) + 1))
    a.send(("stop",))
    b.send(("stop",))
    loop.join(10)
    assert not loop.is_alive(), "the loop did not end after its last client left"


def test_a_client_that_goes_away_has_its_requests_aborted() -> None:
    engine = FakeEngine(length=10_000)
    (a, a_child), (b, b_child) = multiprocessing.Pipe(), multiprocessing.Pipe()
    loop = threading.Thread(target=_EngineLoop(engine, [a_child, b_child]).run, daemon=True)
    loop.start()
    reader_b = _Reader(b)  # b is read all along, as its API server's reader thread does
    a.send(_add("mine"))
    b.send(_add("theirs"))
    # a is read here until both adds are in (an unread pipe fills with every step's stats
    # and blocks the loop's send, which once starved b's reply on a loaded machine)
    got_a: list[tuple[Any, ...]] = []
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline and not (
        ("added", "mine", None) in got_a and ("added", "theirs", None) in reader_b.msgs
    ):
        if a.poll(0.05):
            got_a.append(a.recv())
    assert ("added", "mine", None) in got_a
    assert ("added", "theirs", None) in reader_b.msgs
    a.close()  # the API server died: its end of the pipe is gone
    deadline = time.monotonic() + 20
    while "mine" not in engine.aborted and time.monotonic() < deadline:
        time.sleep(0.01)
    assert engine.aborted == ["mine"]
    assert loop.is_alive(), "the other client's requests must go on"
    b.send(("stop",))
    loop.join(10)
    assert not loop.is_alive()
    assert engine.aborted == ["mine", "theirs"]  # the last client left with a request
