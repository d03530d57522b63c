"""Startup failures inside the engine process come back as one readable line and a
non-zero exit, with no traceback and no engine process left behind."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest
from conftest import engine_cli, free_port


@pytest.mark.parametrize(
    ("flags", "needle"),
    [
        (["--plugin", "nosuchplugin"], "plugin 'nosuchplugin' was requested (--plugin"),
        (["--max-model-len", "100000"], "--max-model-len 100000 is larger than the model"),
        (["--quantization", "awq"], "quantization 'awq' (--quantization)"),
    ],
)
def test_engine_process_startup_error_is_one_line(
    tiny_model: Path, flags: list[str], needle: str
) -> None:
    cmd = [*engine_cli(), "serve", str(tiny_model), "--device", "cpu", "--port", str(free_port())]
    r = subprocess.run([*cmd, *flags], capture_output=True, text=True, timeout=180)
    assert r.returncode == 1, r.stderr[-2000:]
    errors = [line for line in r.stderr.splitlines() if " ERROR " in line]
    assert len(errors) == 1 and needle in errors[0], r.stderr[-2000:]
    assert "Traceback" not in r.stderr
