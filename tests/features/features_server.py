"""Real ``engine serve`` subprocesses for the feature tests (imported by conftest.py and
the tests; a uniquely named module, so it never clashes with another directory's conftest)."""

from __future__ import annotations

import sys
from pathlib import Path

from engine_sdk.testing.server import ServerProcess, free_port

HERE = Path(__file__).parent
STARTUP_TIMEOUT_S = 120.0
SERVER_FLAGS = [
    "--device", "cpu", "--dtype", "float32", "--max-model-len", "2048",
    "--kv-cache-memory-bytes", str(8 * 1024 * 1024), "--max-num-seqs", "8",
    "--log-stats-interval", "0",
]  # fmt: skip


def engine_cli() -> list[str]:
    return [sys.executable, "-m", "engine.cli.main"]


Server = ServerProcess  # the SDK's server subprocess


def start_server(model: Path, *flags: str, served_name: str | None = "tiny") -> Server:
    """``served_name`` None: the default served names (the model path, then its base name)."""
    port = free_port()
    names = [] if served_name is None else ["--served-model-name", served_name]
    cmd = [*engine_cli(), "serve", str(model), "--port", str(port), *SERVER_FLAGS, *names, *flags]
    return ServerProcess(cmd, port, cwd=HERE, startup_timeout_s=STARTUP_TIMEOUT_S).start()


def start_scripted_server(model: Path, scripts: list[str], *flags: str) -> Server:
    """``engine serve`` over the scripted engine (``scripted_server.py``): a request's
    ``seed`` picks which of ``scripts`` it "generates"; served as ``tiny``."""
    import json

    port = free_port()
    cmd = [
        sys.executable, str(HERE / "scripted_server.py"), str(model), str(model),
        "--port", str(port), "--served-model-name", "tiny", "--log-stats-interval", "0",
        *flags,
    ]  # fmt: skip
    env = {"SCRIPTS": json.dumps(scripts)}
    return ServerProcess(cmd, port, env=env, cwd=HERE, startup_timeout_s=STARTUP_TIMEOUT_S).start()
