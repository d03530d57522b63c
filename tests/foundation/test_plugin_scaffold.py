"""``engine plugins new NAME --kind KIND``: the template's output for every kind builds as a
wheel, installs into a fresh venv, passes its own tests (the SDK conformance suite
included) and shows as loaded in ``engine plugins list``."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from engine_sdk import SPEC_KINDS
from wheels import build_wheels, fresh_venv, pip_install, run_python

REPO_ROOT = Path(__file__).resolve().parents[2]
TEMPLATE = REPO_ROOT / "examples" / "plugin_template"


def _new(*args: str) -> subprocess.CompletedProcess[str]:
    return run_python(Path(sys.executable), "-m", "engine.cli.main", "plugins", "new", *args)


def _tree(folder: Path) -> dict[str, str]:
    return {
        str(p.relative_to(folder)): p.read_text()
        for p in sorted(folder.rglob("*"))
        if p.is_file() and "__pycache__" not in p.parts and ".egg-info" not in str(p)
    }


def test_examples_plugin_template_is_what_the_scaffold_writes(tmp_path: Path) -> None:
    out = _new("myplugin", "--kind", "tool_parser", "--dir", str(tmp_path))
    assert out.returncode == 0, out.stderr
    assert _tree(tmp_path / "engine-myplugin") == _tree(TEMPLATE)


def test_bad_requests_say_what_to_change(tmp_path: Path) -> None:
    bad_name = _new("My-Plugin", "--kind", "tool_parser", "--dir", str(tmp_path))
    assert bad_name.returncode == 1
    assert "must be lower-case letters" in bad_name.stderr
    bad_kind = _new("x", "--kind", "parser", "--dir", str(tmp_path))
    assert "unknown kind 'parser'; use one of: attention_backend" in bad_kind.stderr
    assert _new("x", "--kind", "cli_command", "--dir", str(tmp_path)).returncode == 0
    again = _new("x", "--kind", "cli_command", "--dir", str(tmp_path))
    assert "already exists" in again.stderr


def test_every_kind_has_a_template() -> None:
    from engine.plugins.scaffold import IMPL_MODULES, TEMPLATES

    assert set(IMPL_MODULES) == set(SPEC_KINDS)
    for kind in SPEC_KINDS:
        assert sorted(p.name for p in (TEMPLATES / kind).iterdir()) == [
            "impl.py.tmpl", "plugin.py.tmpl", "test.py.tmpl"
        ], kind  # fmt: skip


@pytest.mark.slow
def test_every_kind_builds_installs_passes_its_tests_and_is_listed(tmp_path: Path) -> None:
    names = {kind: f"new_{kind}" for kind in SPEC_KINDS}
    folders = []
    for kind, name in names.items():
        out = _new(name, "--kind", kind, "--dir", str(tmp_path / "src"))
        assert out.returncode == 0, out.stderr
        folders.append(tmp_path / "src" / f"engine-{name.replace('_', '-')}")
    wheels = build_wheels(folders, tmp_path / "wheels")
    assert len(wheels) == len(SPEC_KINDS)
    python = fresh_venv(tmp_path / "venv")
    pip_install(python, *wheels)

    listed = run_python(python, "-m", "engine.cli.main", "plugins", "list", "--json")
    assert listed.returncode == 0, listed.stderr
    plugins = {p["name"]: p for p in json.loads(listed.stdout)["plugins"]}
    for kind, name in names.items():
        assert plugins[name]["status"] == "loaded", plugins[name]
        assert list(plugins[name]["provides"]) == [kind]
        assert plugins[name]["sdk_compatible"] is True

    # Each package's own tests, against the installed wheel (not the source folder).
    tests = [str(folder / "tests") for folder in folders]
    run = run_python(python, "-m", "pytest", "-q", "-p", "no:cacheprovider", *tests, cwd=tmp_path)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    assert " passed" in run.stdout and "failed" not in run.stdout
    hello = run_python(python, "-m", "engine.cli.main", "new_cli_command", "--name", "ci")
    assert hello.stdout.strip() == "hello ci from engine-new-cli-command", hello.stderr
