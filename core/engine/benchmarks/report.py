"""Percentiles, the result record (command, commit, device, date) and the printed table."""

from __future__ import annotations

import datetime
import json
import shlex
import subprocess
import sys
from pathlib import Path
from typing import Any


def percentiles(values: list[float], ps: tuple[int, ...] = (50, 95, 99)) -> dict[str, float]:
    """mean and pXX of ``values`` (linear interpolation); zeros for an empty list."""
    if not values:
        return {"mean": 0.0, **{f"p{p}": 0.0 for p in ps}}
    data = sorted(values)
    out = {"mean": sum(data) / len(data)}
    for p in ps:
        k = (len(data) - 1) * p / 100
        lo = int(k)
        hi = min(lo + 1, len(data) - 1)
        out[f"p{p}"] = data[lo] + (data[hi] - data[lo]) * (k - lo)
    return out


def git_commit() -> str | None:
    try:
        return subprocess.run(
            ["git", "rev-parse", "HEAD"], capture_output=True, text=True, timeout=5, check=True
        ).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return None


def device_name() -> str:
    try:
        import torch

        if torch.cuda.is_available():
            return str(torch.cuda.get_device_name(0))
    except ImportError:
        pass
    import platform

    return f"cpu ({platform.processor() or platform.machine()})"


def envelope(kind: str, result: dict[str, Any]) -> dict[str, Any]:
    return {
        "benchmark": kind,
        "command": " ".join(shlex.quote(a) for a in sys.argv),
        "git_commit": git_commit(),
        "device": device_name(),
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        **result,
    }


def save(path: str | None, record: dict[str, Any]) -> None:
    if path:
        Path(path).write_text(json.dumps(record, indent=2) + "\n")


def table(rows: list[tuple[str, Any]]) -> str:
    width = max(len(k) for k, _ in rows)
    lines = []
    for key, value in rows:
        text = f"{value:,.2f}" if isinstance(value, float) else str(value)
        lines.append(f"{key:<{width}}  {text}")
    return "\n".join(lines)
