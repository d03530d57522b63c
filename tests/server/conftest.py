"""Fixtures: a real ``engine serve`` subprocess on a tiny model, and a stand-in-engine server.

``server`` (session) runs the real engine on a tiny random Qwen3 checkpoint with an API key;
``make_fake_server`` starts ``fake_server.py`` (the real HTTP stack over ``FakeEngineClient``)
for behaviour the real engine cannot be steered into (full queue, failure mid-stream,
slow requests for SIGTERM drain).
"""

from __future__ import annotations

import importlib.util
import json
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from engine_sdk.testing.server import ServerProcess as SdkServerProcess
from engine_sdk.testing.server import free_port

HERE = Path(__file__).parent
API_KEY = "test-key-123"
STARTUP_TIMEOUT_S = 90.0


def engine_cli() -> list[str]:
    return [sys.executable, "-m", "engine.cli.main"]


@dataclass
class ServerProcess(SdkServerProcess):
    """The SDK's server subprocess, run from this folder (``fake_server.py``), the key
    passed by ``--config`` rather than the environment."""

    startup_timeout_s: float = STARTUP_TIMEOUT_S
    cwd: Path | None = HERE


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
    layer stays tested.
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
