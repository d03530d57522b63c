"""Fixtures for the foundation tests: running the CLI and faking installed plugins."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from collections.abc import Callable
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parents[2]

RunEngine = Callable[..., subprocess.CompletedProcess[str]]
FakeDist = Callable[..., Path]


@pytest.fixture
def run_engine() -> RunEngine:
    """Run ``python -m engine.cli.main ARGS`` in a subprocess; extra PYTHONPATH and env."""

    def run(
        *args: str, pythonpath: Path | None = None, env: dict[str, str] | None = None
    ) -> subprocess.CompletedProcess[str]:
        full_env = {k: v for k, v in os.environ.items() if not k.startswith("ENGINE_")}
        if pythonpath is not None:
            full_env["PYTHONPATH"] = str(pythonpath)
        full_env.update(env or {})
        return subprocess.run(
            [sys.executable, "-m", "engine.cli.main", *args],
            capture_output=True,
            text=True,
            env=full_env,
            timeout=120,
            check=False,
        )

    return run


@pytest.fixture
def fake_dist(tmp_path: Path) -> FakeDist:
    """Write an installed-looking distribution (``*.dist-info`` + module) into one folder.

    ``fake_dist(name, source)`` creates distribution ``engine-<name>`` whose entry point
    ``<name>`` in group ``engine.plugins`` is module ``fake_<name>`` with ``source``.
    Returns the folder to put on ``PYTHONPATH``.
    """
    site = tmp_path / "site"
    site.mkdir(exist_ok=True)

    def make(
        name: str,
        source: str,
        *,
        dist: str | None = None,
        requires: str = "engine-sdk>=0.1,<0.2",
        version: str = "0.3.0",
    ) -> Path:
        dist_name = dist or f"engine-{name}"
        module = f"fake_{name}_{dist_name.replace('-', '_')}"
        (site / f"{module}.py").write_text(textwrap.dedent(source))
        info = site / f"{dist_name.replace('-', '_')}-{version}.dist-info"
        info.mkdir()
        (info / "METADATA").write_text(
            f"Metadata-Version: 2.1\nName: {dist_name}\nVersion: {version}\n"
            + (f"Requires-Dist: {requires}\n" if requires else "")
        )
        (info / "entry_points.txt").write_text(f"[engine.plugins]\n{name} = {module}\n")
        return site

    return make
