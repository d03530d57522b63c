"""Every engine client satisfies the typed ``EngineClient`` protocol (checked by mypy).

The API server and the offline paths talk to the engine only through
``engine.engine_client.EngineClient``; a client whose method drifts from the protocol (a
renamed method, a changed signature or return type) fails this test.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

CHECK = """
from engine.async_llm import AsyncLLM
from engine.data_parallel import DataParallelAsyncLLM
from engine.engine_client import EngineClient
from engine.engine_process import ProcessAsyncLLM
from engine.testing.fake_client import FakeEngineClient


def clients(
    a: AsyncLLM, b: ProcessAsyncLLM, c: DataParallelAsyncLLM, d: FakeEngineClient
) -> list[EngineClient]:
    return [a, b, c, d]
"""

BROKEN = """
from engine.engine_client import EngineClient


class Drifted:
    def abort(self, request_id: int) -> None: ...


def client(d: Drifted) -> EngineClient:
    return d
"""


def _mypy(tmp_path: Path, source: str) -> subprocess.CompletedProcess[str]:
    path = tmp_path / "check_clients.py"
    path.write_text(source)
    cmd = [
        sys.executable, "-m", "mypy", "--follow-imports=silent", "--ignore-missing-imports",
        "--no-incremental", "--config-file", "/dev/null", str(path),
    ]  # fmt: skip
    # The editable install's import hook is invisible to mypy: point it at the sources.
    root = Path(__file__).resolve().parents[2]
    env = {**os.environ, "MYPYPATH": f"{root / 'core'}{os.pathsep}{root / 'sdk'}"}
    return subprocess.run(cmd, capture_output=True, text=True, timeout=600, env=env)


@pytest.mark.slow
def test_every_client_implements_the_protocol(tmp_path: Path) -> None:
    result = _mypy(tmp_path, CHECK)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "Success" in result.stdout


@pytest.mark.slow
def test_a_drifted_client_is_caught(tmp_path: Path) -> None:
    result = _mypy(tmp_path, BROKEN)
    assert result.returncode == 1, result.stdout + result.stderr
    assert "EngineClient" in result.stdout
