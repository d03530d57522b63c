"""Real ``engine serve`` subprocesses for the feature tests (imported by conftest.py and
the tests; a uniquely named module, so it never clashes with another directory's conftest)."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import httpx

HERE = Path(__file__).parent
STARTUP_TIMEOUT_S = 120.0
SERVER_FLAGS = [
    "--device", "cpu", "--dtype", "float32", "--max-model-len", "2048",
    "--kv-cache-memory-bytes", str(8 * 1024 * 1024), "--max-num-seqs", "8",
    "--served-model-name", "tiny", "--log-stats-interval", "0",
]  # fmt: skip


def engine_cli() -> list[str]:
    return [sys.executable, "-m", "engine.cli.main"]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass
class Server:
    proc: subprocess.Popen[bytes]
    port: int
    log_path: Path

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1"

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


def start_server(model: Path, *flags: str) -> Server:
    port = free_port()
    fd, name = tempfile.mkstemp(prefix="engine-features-", suffix=".log")
    cmd = [*engine_cli(), "serve", str(model), "--port", str(port), *SERVER_FLAGS, *flags]
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    env.pop("ENGINE_API_KEY", None)
    proc = subprocess.Popen(cmd, stdout=fd, stderr=subprocess.STDOUT, env=env, cwd=HERE)
    os.close(fd)
    server = Server(proc, port, Path(name))
    deadline = time.monotonic() + STARTUP_TIMEOUT_S
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"server exited with {proc.returncode}:\n{server.log()}")
        try:
            if httpx.get(f"http://127.0.0.1:{port}/health", timeout=1).status_code == 200:
                return server
        except httpx.HTTPError:
            pass
        time.sleep(0.2)
    server.stop()
    raise RuntimeError(f"server not healthy in {STARTUP_TIMEOUT_S}s:\n{server.log()}")
