"""A dead or wedged engine ends ``engine serve`` with a non-zero exit code within seconds
(issue 17 item 4), so a supervisor restarts it; the log says why. Before, a SIGKILLed
engine process left the server answering 503 forever."""

from __future__ import annotations

import os
import signal
from pathlib import Path

import pytest
from engine_sdk.testing.server import child_pids, process_cmdline, wait_gone
from sec_helpers import Server, free_port, serve_cmd

pytestmark = pytest.mark.timeout(300)
EXIT_WITHIN_S = 10.0


def _engine_pid(server: Server) -> int:
    assert server.proc is not None
    engines = [p for p in child_pids(server.proc.pid) if "spawn_main" in process_cmdline(p)]
    assert len(engines) == 1, engines
    return engines[0]


def test_sigkill_of_the_engine_process_ends_the_server(tiny_model: Path) -> None:
    port = free_port()
    server = Server(serve_cmd(tiny_model, port), port).start()
    assert server.proc is not None
    try:
        os.kill(_engine_pid(server), signal.SIGKILL)
        code = server.proc.wait(EXIT_WITHIN_S)
    finally:
        server.stop()
    assert code not in (0, None), code
    log = server.log()
    assert "the engine stopped" in log, log[-3000:]
    assert "the engine process exited" in log, log[-3000:]


def test_a_silent_idle_engine_process_ends_the_server(tiny_model: Path) -> None:
    port = free_port()
    cmd = serve_cmd(tiny_model, port, "--engine-heartbeat-timeout", "2")
    server = Server(cmd, port).start()
    assert server.proc is not None
    engine = _engine_pid(server)
    try:
        os.kill(engine, signal.SIGSTOP)  # wedged: alive, but its loop never runs
        code = server.proc.wait(EXIT_WITHIN_S)
    finally:
        server.stop()
        try:
            os.kill(engine, signal.SIGKILL)
        except ProcessLookupError:
            pass
    assert code not in (0, None), code
    assert "has sent no heartbeat" in server.log(), server.log()[-3000:]
    assert wait_gone(engine, 15)
