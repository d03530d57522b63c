"""Helpers of the tensor-parallel tests: engine settings and process liveness."""

from __future__ import annotations

import time
from pathlib import Path

# Engine settings shared by the tests: CPU float32 (exact), small blocks.
BASE = {"device": "cpu", "dtype": "float32", "block_size": 4}


def pid_alive(pid: int) -> bool:
    """True while ``pid`` runs (a zombie counts as gone: it has exited)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except (FileNotFoundError, ProcessLookupError):
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


def wait_gone(pids: list[int], timeout: float) -> list[int]:
    """The pids still alive after ``timeout`` seconds (polling)."""
    deadline = time.monotonic() + timeout
    while True:
        alive = [p for p in pids if pid_alive(p)]
        if not alive or time.monotonic() > deadline:
            return alive
        time.sleep(0.1)
