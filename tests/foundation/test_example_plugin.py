"""The example third-party plugin and the plugin template: their own tests, and the example
built as a wheel and installed into a fresh venv without torch, next to engine's wheels."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = REPO_ROOT / "examples" / "plugins" / "engine-example-reasoning"
TEMPLATE = REPO_ROOT / "examples" / "plugin_template"


def _run(cmd: list[str], **kwargs: object) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("ENGINE_", "VIRTUAL_ENV"))}
    env.update(kwargs.pop("env", {}))  # type: ignore[arg-type]
    out = subprocess.run(
        cmd, capture_output=True, text=True, timeout=600, check=False, env=env, **kwargs
    )  # type: ignore[call-overload]
    assert out.returncode == 0, f"{' '.join(cmd)} failed:\n{out.stdout}\n{out.stderr}"
    return out


@pytest.mark.parametrize("folder", [EXAMPLE, TEMPLATE], ids=["example", "template"])
def test_own_tests_pass(folder: Path) -> None:
    out = _run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", str(folder / "tests")],
        cwd=folder,
        env={"PYTHONPATH": str(folder)},
    )
    assert " passed" in out.stdout and "failed" not in out.stdout


@pytest.mark.slow
def test_example_in_fresh_venv(tmp_path: Path) -> None:
    wheels = tmp_path / "wheels"
    pip = [sys.executable, "-m", "pip"]
    sources = [str(REPO_ROOT / "sdk"), str(REPO_ROOT / "core"), str(EXAMPLE)]
    _run([*pip, "wheel", "--no-deps", "-q", "-w", str(wheels), *sources])
    built = sorted(p.name for p in wheels.glob("*.whl"))
    assert [name.split("-")[0] for name in built] == [
        "engine",
        "engine_example_reasoning",
        "engine_sdk",
    ], built

    venv = tmp_path / "fresh"
    _run([sys.executable, "-m", "venv", str(venv)])
    python = str(venv / "bin" / "python")
    # engine's own wheels without their heavy dependencies (torch, transformers, ...):
    # `engine plugins list` needs only pluggy and typer.
    _run([python, "-m", "pip", "install", "-q", "--no-deps", *map(str, wheels.glob("*.whl"))])
    _run([python, "-m", "pip", "install", "-q", "pluggy>=1.5", "typer>=0.12"])
    site_check = _run([python, "-c", "import importlib.util as u; print(u.find_spec('torch'))"])
    assert site_check.stdout.strip() == "None", "the fresh venv must not see torch"

    out = _run([str(venv / "bin" / "engine"), "plugins", "list", "--json"], cwd=tmp_path)
    plugins = {p["name"]: p for p in json.loads(out.stdout)["plugins"]}
    assert set(plugins) == {"example_reasoning"}, plugins
    example = plugins["example_reasoning"]
    assert example["distribution"] == "engine-example-reasoning"
    assert example["status"] == "loaded"
    assert example["provides"] == {"reasoning_parser": ["tagged_reasoning"]}
    assert example["sdk_compatible"] is True

    code = (
        "from engine.plugins import PluginManager\n"
        "pm = PluginManager.load(requested=['example_reasoning'])\n"
        "cls = pm.registry.resolve('reasoning_parser', 'tagged_reasoning')\n"
        "print(cls().extract_reasoning('<reasoning>think</reasoning>answer'))\n"
    )
    out = _run([python, "-c", code], cwd=tmp_path)
    assert out.stdout.strip() == "('think', 'answer')"


@pytest.mark.slow
def test_every_first_party_plugin_builds_a_wheel(tmp_path: Path) -> None:
    folders = sorted(p.parent for p in REPO_ROOT.glob("plugins/*/pyproject.toml"))
    assert folders
    pip = [sys.executable, "-m", "pip"]
    _run([*pip, "wheel", "--no-deps", "-q", "-w", str(tmp_path), *map(str, folders)])
    for folder in folders:
        package = f"engine_{folder.name}"
        (wheel,) = tmp_path.glob(f"{package}-*.whl")
        with zipfile.ZipFile(wheel) as zf:
            names = zf.namelist()
            assert f"{package}/plugin.py" in names, f"{wheel.name} lacks {package}/plugin.py"
            (entry_points,) = [n for n in names if n.endswith(".dist-info/entry_points.txt")]
            text = zf.read(entry_points).decode()
        assert "[engine.plugins]" in text and f"{folder.name} = {package}.plugin" in text
