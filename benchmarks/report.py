"""Shared output helpers of the benchmark scripts: a plain-text table and the commit that ran.

Light on purpose (no torch, no engine imports): scripts import it before deciding how to
import the engine (``quant_gemv_gpu.py --smoke`` switches Triton to its interpreter first).
"""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]


def table(rows: list[dict[str, Any]], keys: list[str]) -> str:
    """``rows`` as aligned columns ``keys``; floats to 4 significant digits, missing "-"."""

    def cell(v: Any) -> str:
        return f"{v:.4g}" if isinstance(v, float) else "-" if v is None else str(v)

    cells = [[cell(r.get(k)) for k in keys] for r in rows]
    widths = [max(len(k), *(len(c[i]) for c in cells)) for i, k in enumerate(keys)]
    lines = ["  ".join(k.ljust(w) for k, w in zip(keys, widths, strict=True))]
    lines += ["  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)) for row in cells]
    return "\n".join(lines)


def git_commit() -> str | None:
    """The checked-out commit, or None outside a git checkout."""
    try:
        out = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True, cwd=REPO)
        return out.stdout.strip() or None
    except OSError:
        return None
