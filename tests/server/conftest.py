"""Fixtures: a real ``engine serve`` subprocess on a tiny model, and a stand-in-engine server.

``server`` (session) runs the real engine on a tiny random Qwen3 checkpoint with an API key;
``make_fake_server`` starts ``fake_server.py`` (the real HTTP stack over ``FakeAsyncLLM``)
for behaviour the real engine cannot be steered into (full queue, failure mid-stream,
slow requests for SIGTERM drain).
"""

from __future__ import annotations

import importlib.util
import json
import os
import signal
import socket
import ssl
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import pytest

HERE = Path(__file__).parent
API_KEY = "test-key-123"
STARTUP_TIMEOUT_S = 90.0


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def engine_cli() -> list[str]:
    return [sys.executable, "-m", "engine.cli.main"]


@dataclass
class ServerProcess:
    cmd: list[str]
    port: int
    api_key: str | None = None
    env: dict[str, str] = field(default_factory=dict)
    proc: subprocess.Popen[str] | None = None
    real: bool = False
    log_path: Path | None = None
    scheme: str = "http"
    verify: ssl.SSLContext | bool = True  # trusts the certificate of an https server

    @property
    def base_url(self) -> str:
        return f"{self.scheme}://127.0.0.1:{self.port}"

    @property
    def headers(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.api_key}"} if self.api_key else {}

    def start(self) -> ServerProcess:
        fd, name = tempfile.mkstemp(prefix="engine-serve-", suffix=".log")
        self.log_path = Path(name)
        env = {**os.environ, "PYTHONUNBUFFERED": "1", **self.env}
        env.pop("ENGINE_API_KEY", None)
        self.proc = subprocess.Popen(
            self.cmd, stdout=fd, stderr=subprocess.STDOUT, text=True, env=env, cwd=HERE
        )
        os.close(fd)
        deadline = time.monotonic() + STARTUP_TIMEOUT_S
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"server exited with {self.proc.returncode}:\n{self.log()}")
            try:
                health = httpx.get(self.base_url + "/health", timeout=1, verify=self.verify)
                if health.status_code == 200:
                    return self
            except httpx.HTTPError:
                pass
            time.sleep(0.2)
        self.stop()
        raise RuntimeError(f"server did not become healthy in {STARTUP_TIMEOUT_S}s:\n{self.log()}")

    def log(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path else ""

    def stop(self, timeout: float = 30.0) -> int | None:
        if self.proc is None or self.proc.poll() is not None:
            return self.proc.returncode if self.proc else None
        self.proc.send_signal(signal.SIGTERM)
        try:
            return self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            return self.proc.wait()


def real_engine_available() -> bool:
    modules = ("engine.async_llm", "engine.model_executor.runner")
    try:
        return all(importlib.util.find_spec(m) is not None for m in modules)
    except ModuleNotFoundError:
        return False


@pytest.fixture(scope="session")
def tiny_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from engine_sdk.testing.models import build_tiny_model

    return build_tiny_model(tmp_path_factory.mktemp("tiny-qwen3"), "Qwen3ForCausalLM")


@pytest.fixture(scope="session")
def tiny_tokenizer_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from engine_sdk.testing.models import build_tiny_tokenizer

    path = tmp_path_factory.mktemp("tiny-tokenizer")
    build_tiny_tokenizer(path)
    return path


REAL_SERVER_FLAGS = [
    "--device", "cpu", "--dtype", "float32", "--max-model-len", "256",
    "--kv-cache-memory-bytes", str(4 * 1024 * 1024), "--max-num-seqs", "32",
    "--served-model-name", "tiny", "tiny-alias", "--log-stats-interval", "1",
]  # fmt: skip


@pytest.fixture(scope="session")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    """The real engine behind ``engine serve`` (tiny model), with an API key from --config.

    Until ``engine.async_llm`` exists this falls back to the stand-in engine so the HTTP
    layer stays tested; ``server.real`` says which one runs.
    """
    from engine_sdk.testing.models import build_tiny_model, build_tiny_tokenizer

    port = free_port()
    if real_engine_available():
        model = build_tiny_model(tmp_path_factory.mktemp("tiny-qwen3"), "Qwen3ForCausalLM")
        cmd = [*engine_cli(), "serve", str(model), "--port", str(port), *REAL_SERVER_FLAGS]
    else:
        model = tmp_path_factory.mktemp("tiny-tokenizer")
        build_tiny_tokenizer(model)
        cmd = [sys.executable, str(HERE / "fake_server.py"), str(model), "--model", "fake"]
        cmd += ["--port", str(port), "--served-model-name", "tiny", "tiny-alias"]
        cmd += ["--log-stats-interval", "1"]
    fake_config = json.dumps({"max_queued": 64, "max_running": 8})
    proc = ServerProcess(cmd, port, api_key=API_KEY, env={"FAKE_ENGINE_CONFIG": fake_config})
    proc.cmd += ["--config", str(_write_config(model.parent, {"api-key": API_KEY}))]
    proc.real = real_engine_available()
    proc.start()
    yield proc
    proc.stop()


def _write_config(folder: Path, values: dict[str, object]) -> Path:
    import yaml

    path = folder / f"serve-{len(values)}-{time.monotonic_ns()}.yaml"
    path.write_text(yaml.safe_dump(values))
    return path


FakeServerFactory = Callable[..., ServerProcess]


@pytest.fixture
def make_fake_server(tiny_tokenizer_dir: Path) -> Iterator[FakeServerFactory]:
    started: list[ServerProcess] = []

    def make(*flags: str, api_key: str | None = None, **engine: object) -> ServerProcess:
        port = free_port()
        cmd = [sys.executable, str(HERE / "fake_server.py"), str(tiny_tokenizer_dir)]
        cmd += ["--model", "fake", "--port", str(port), *flags]
        env = {"FAKE_ENGINE_CONFIG": json.dumps(engine)}
        if api_key:
            env["ENGINE_API_KEY"] = api_key
        proc = ServerProcess(cmd, port, api_key=api_key, env=env)
        started.append(proc)
        if api_key:  # ServerProcess.start drops ENGINE_API_KEY; pass it through the config
            proc.cmd += ["--config", str(_write_config(tiny_tokenizer_dir, {"api_key": api_key}))]
        return proc.start()

    yield make
    for proc in started:
        proc.stop()
