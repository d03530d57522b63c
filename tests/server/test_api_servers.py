"""``engine serve --api-server-count 2``: two HTTP front ends over one engine process.

A real server on the tiny model: requests on separate connections reach both API servers
and all succeed (streamed and not), any process's /metrics counts the whole engine,
SIGTERM drains and exits 0 leaving no process behind, and the death of one API server
stops the whole server with exit code 1.
"""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest
from conftest import REAL_SERVER_FLAGS, ServerProcess, engine_cli
from engine_sdk.testing.server import child_pids, free_port, process_cmdline, wait_gone

pytestmark = pytest.mark.timeout(300)
NUM_REQUESTS = 32


def start(model: Path, *extra: str) -> ServerProcess:
    port = free_port()
    cmd = [*engine_cli(), "serve", str(model), "--port", str(port), *REAL_SERVER_FLAGS]
    server = ServerProcess([*cmd, "--api-server-count", "2", *extra], port).start()
    deadline = time.monotonic() + 60  # /health answered by one; wait for the other too
    while len(re.findall(r"API server \d ready at", server.log())) < 2:
        assert time.monotonic() < deadline, server.log()
        time.sleep(0.2)
    return server


def spawned_children(server: ServerProcess) -> list[int]:
    assert server.proc is not None
    return [p for p in child_pids(server.proc.pid) if "spawn_main" in process_cmdline(p)]


def one_request(base_url: str, i: int) -> dict[str, Any]:
    """A fresh connection per request, so the kernel spreads them over the API servers."""
    body = {"model": "tiny", "prompt": f"request {i}", "max_tokens": 6, "stream": i % 2 == 0}
    with httpx.Client(base_url=base_url, timeout=60) as client:
        resp = client.post("/v1/completions", json=body)
    assert resp.status_code == 200, resp.text
    if not body["stream"]:
        data: dict[str, Any] = resp.json()
        return data
    events = [line[6:] for line in resp.text.splitlines() if line.startswith("data: ")]
    assert events[-1] == "[DONE]", events
    chunks = [json.loads(e) for e in events[:-1]]
    return {
        "id": chunks[0]["id"],
        "choices": [{"finish_reason": chunks[-1]["choices"][0]["finish_reason"]}],
    }


def test_two_api_servers_share_the_load_and_drain(tiny_model: Path) -> None:
    server = start(tiny_model, "--enable-log-requests")
    try:
        children = spawned_children(server)
        assert len(children) == 3, "expected the engine process and two API servers"
        with ThreadPoolExecutor(16) as pool:
            results = list(pool.map(lambda i: one_request(server.base_url, i), range(32)))
        assert len({r["id"] for r in results}) == NUM_REQUESTS
        assert all(r["choices"][0]["finish_reason"] in ("length", "stop") for r in results)

        client = openai.OpenAI(base_url=server.base_url + "/v1", api_key="unused")
        chat = client.chat.completions.create(
            model="tiny",
            messages=[{"role": "user", "content": "hi"}],
            max_tokens=3,
            extra_body={"ignore_eos": True},  # a random model may sample EOS early
        )
        assert chat.usage is not None and chat.usage.completion_tokens == 3

        # Each API server logs the requests it handled, tagged with its index.
        served_by = set(re.findall(r"\[(\d)\]: completion request ", server.log()))
        assert served_by == {"0", "1"}, server.log()[-3000:]

        # Whichever process answers /metrics reports every request the engine finished.
        for _ in range(4):
            with httpx.Client(base_url=server.base_url) as fresh:  # a new connection
                text = fresh.get("/metrics").text
            finished = sum(
                float(m) for m in re.findall(r'^engine:request_success_total\{.*\} (\S+)$',
                                              text, re.M)
            )  # fmt: skip
            assert finished >= NUM_REQUESTS + 1, text
    finally:
        code = server.stop()
    assert code == 0, server.log()[-3000:]
    for pid in children:
        assert wait_gone(pid, 15), f"process {pid} outlived the server"


def test_a_dead_api_server_stops_the_whole_server(tiny_model: Path) -> None:
    server = start(tiny_model)
    assert server.proc is not None
    try:
        children = spawned_children(server)
        api_servers = [int(p) for p in re.findall(r"\]: Started server process \[(\d+)\]",
                                                  server.log())]  # fmt: skip
        assert len(api_servers) == 2 and set(api_servers) <= set(children), server.log()
        os.kill(api_servers[0], signal.SIGKILL)
        assert server.proc.wait(30) == 1
    finally:
        server.stop()
    assert "exited unexpectedly" in server.log(), server.log()[-3000:]
    for pid in children:
        assert wait_gone(pid, 15), f"process {pid} outlived the server"


def test_the_port_in_use_is_named(tiny_model: Path) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        cmd = [*engine_cli(), "serve", str(tiny_model), "--port", str(port), *REAL_SERVER_FLAGS]
        done = subprocess.run(
            [*cmd, "--api-server-count", "2"], capture_output=True, text=True, timeout=60
        )
    assert done.returncode == 1, done.stderr
    assert f"cannot listen on 127.0.0.1:{port}" in done.stderr
    assert "choose another --port" in done.stderr
    assert "Started 2 API server" not in done.stderr  # refused before the engine started
