"""Every first-party plugin passes the SDK conformance suite that third parties use, and
declares its facts the way the contract asks (architectures on the spec only)."""

from __future__ import annotations

import importlib
import sys
from pathlib import Path

import pytest
from engine_sdk.testing import assert_plugin_conforms
from engine_sdk.testing.conformance import imports_torch

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - Python 3.10
    import tomli as tomllib

REPO_ROOT = Path(__file__).resolve().parents[2]


def _entry_modules() -> list[str]:
    modules = []
    for pyproject in sorted(REPO_ROOT.glob("plugins/*/pyproject.toml")):
        data = tomllib.loads(pyproject.read_text())
        modules += data["project"]["entry-points"]["engine.plugins"].values()
    return modules


@pytest.mark.parametrize("module_name", _entry_modules())
def test_first_party_plugin_conforms(module_name: str) -> None:
    module = importlib.import_module(module_name)
    report = assert_plugin_conforms(module)
    assert report.specs, f"{module_name} provides nothing"
    assert not imports_torch(module_name), f"importing {module_name} imports torch"
    for spec in report.specs.get("model_architecture", []):
        module_path, _, class_name = spec.target.partition(":")
        cls = getattr(importlib.import_module(module_path), class_name)
        assert "architectures" not in vars(cls), (
            f"{spec.target} declares architectures on the class; the spec is the one "
            "place (ModelArchitectureSpec.architectures)"
        )
