"""A real ``engine serve`` (or any OpenAI-style server command) as a subprocess, for tests
that drive the server as users do: start it on a free port, wait for ``/health``, read
its log on failure, stop it with SIGTERM (then SIGKILL).

    server = ServerProcess(["engine", "serve", model, "--port", str(port)], port).start()
    try:
        ...  # openai.OpenAI(base_url=server.base_url + "/v1", api_key=...)
    finally:
        server.stop()

Only the standard library: plugin test suites need nothing beyond the SDK.
"""

from __future__ import annotations

import os
import signal
import socket
import ssl
import subprocess
import tempfile
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

__all__ = ["ServerProcess", "child_pids", "free_port", "process_cmdline", "wait_gone"]


def free_port() -> int:
    """A TCP port on 127.0.0.1 that was free a moment ago."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def child_pids(pid: int) -> list[int]:
    """The direct children of ``pid`` (Linux: read from /proc)."""
    kids = []
    for status in Path("/proc").glob("[0-9]*/status"):
        try:
            text = status.read_text()
        except OSError:
            continue
        if f"\nPPid:\t{pid}\n" in text:
            kids.append(int(status.parent.name))
    return kids


def process_cmdline(pid: int) -> str:
    """``pid``'s command line, space-separated ("" once it is gone)."""
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
    except OSError:
        return ""


def wait_gone(pid: int, timeout: float) -> bool:
    """Wait until ``pid`` has exited (gone, or a zombie its parent has not reaped)."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            state = Path(f"/proc/{pid}/status").read_text(errors="replace")
        except OSError:
            return True
        if "zombie" in state:
            return True
        if time.monotonic() > deadline:
            return False
        time.sleep(0.1)


@dataclass
class ServerProcess:
    """``cmd`` listening on 127.0.0.1:``port``.

    ``api_key``: sent by ``headers``; with ``key_in_env`` also given to the server as
    ``ENGINE_API_KEY`` (else that variable is removed from its environment). ``verify``:
    an SSL context trusting an https server's certificate (``scheme="https"``).
    """

    cmd: list[str]
    port: int
    api_key: str | None = None
    env: dict[str, str] = field(default_factory=dict)
    key_in_env: bool = False
    scheme: str = "http"
    verify: ssl.SSLContext | None = None
    startup_timeout_s: float = 120.0
    cwd: Path | None = None
    proc: subprocess.Popen[str] | None = None
    log_path: Path | None = None

    @property
    def base_url(self) -> str:
        return f"{self.scheme}://127.0.0.1:{self.port}"

    @property
    def headers(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.api_key}"} if self.api_key else {}

    def start(self) -> ServerProcess:
        """Start and wait until ``/health`` answers 200; raise with the log otherwise."""
        fd, name = tempfile.mkstemp(prefix="engine-serve-", suffix=".log")
        self.log_path = Path(name)
        env = {**os.environ, "PYTHONUNBUFFERED": "1", **self.env}
        if self.key_in_env and self.api_key:
            env["ENGINE_API_KEY"] = self.api_key
        else:
            env.pop("ENGINE_API_KEY", None)
        self.proc = subprocess.Popen(
            self.cmd, stdout=fd, stderr=subprocess.STDOUT, text=True, env=env, cwd=self.cwd
        )
        os.close(fd)
        deadline = time.monotonic() + self.startup_timeout_s
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"server exited with {self.proc.returncode}:\n{self.log()}")
            if self.health() == 200:
                return self
            time.sleep(0.2)
        self.stop()
        raise RuntimeError(
            f"server did not become healthy in {self.startup_timeout_s:g}s:\n{self.log()}"
        )

    def health(self) -> int | None:
        """The status of ``GET /health`` (None: no answer)."""
        try:
            with urllib.request.urlopen(
                self.base_url + "/health", timeout=1, context=self.verify
            ) as r:
                return int(r.status)
        except urllib.error.HTTPError as exc:
            return int(exc.code)
        except (OSError, ValueError):
            return None

    def log(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path else ""

    def stop(self, timeout: float = 30.0) -> int | None:
        """SIGTERM (the server drains), SIGKILL after ``timeout``; the exit code."""
        if self.proc is None or self.proc.poll() is not None:
            return self.proc.returncode if self.proc else None
        self.proc.send_signal(signal.SIGTERM)
        try:
            return self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            return self.proc.wait()
