"""The engine_sdk public API against its checked-in snapshot (sdk/api_snapshot.json), and
the deprecation markers that must precede a removal."""

from __future__ import annotations

import importlib.util
import json
import warnings
from pathlib import Path
from types import ModuleType

import engine_sdk
import pluggy
import pytest
from engine_sdk.deprecation import (
    DEPRECATIONS,
    Deprecation,
    SDKDeprecationWarning,
    deprecated_hook_warning,
)
from engine_sdk.interfaces.model import ModelArchitecture
from packaging.version import Version

REPO_ROOT = Path(__file__).resolve().parents[2]


def _snapshot_script() -> ModuleType:
    path = REPO_ROOT / "scripts" / "sdk_api_snapshot.py"
    spec = importlib.util.spec_from_file_location("sdk_api_snapshot", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def removed_without_deprecation(before: set[str], now: set[str], version: str) -> list[str]:
    """Names gone from ``now`` that were not deprecated or whose removal version is later."""
    gone = []
    for name in sorted(before - now):
        deprecation = DEPRECATIONS.get(name)
        if deprecation is None or Version(version) < Version(deprecation.removed_in):
            gone.append(name)
    return gone


def test_no_public_name_disappears_without_a_deprecation() -> None:
    script = _snapshot_script()
    snapshot = json.loads(script.SNAPSHOT_PATH.read_text())
    before, now = script.flatten(snapshot), script.flatten(script.public_api())
    gone = removed_without_deprecation(before, now, engine_sdk.__version__)
    assert not gone, (
        f"public engine_sdk names removed without a deprecation cycle: {gone}. Keep them, "
        "list them in engine_sdk.deprecation.DEPRECATIONS and remove them in the release "
        "named there (docs/plugins/compatibility.md)"
    )
    added = sorted(now - before)
    assert not added, (
        f"new public engine_sdk names {added} are not in sdk/api_snapshot.json; run "
        "python scripts/sdk_api_snapshot.py and commit the snapshot"
    )


def test_the_check_catches_a_removal() -> None:
    member = "engine_sdk.interfaces.tool_parser:ToolParser.requires_special_tokens"
    before = {member, "engine_sdk.interfaces.model:ModelArchitecture.architectures"}
    assert removed_without_deprecation(before, set(), "0.1.1") == [
        "engine_sdk.interfaces.model:ModelArchitecture.architectures",  # deprecated, not yet due
        member,  # never deprecated
    ]
    assert removed_without_deprecation(before, set(), "0.2.0") == [member]


def test_every_deprecated_name_is_still_there_until_its_removal() -> None:
    now = _snapshot_script().flatten(_snapshot_script().public_api())
    for name, deprecation in DEPRECATIONS.items():
        assert Version(deprecation.since) <= Version(engine_sdk.__version__), name
        if Version(engine_sdk.__version__) < Version(deprecation.removed_in):
            assert name in now, f"{name} is removed before {deprecation.removed_in}"


def test_defining_a_deprecated_member_warns_with_the_removal_version() -> None:
    expected = (
        r"Old\.architectures is deprecated since engine-sdk 0\.1\.1 and is removed in "
        r"engine-sdk 0\.2\.0; declare"
    )
    with pytest.warns(SDKDeprecationWarning, match=expected):

        class Old(ModelArchitecture):
            architectures = ("OldForCausalLM",)

    with warnings.catch_warnings():
        warnings.simplefilter("error")

        class New(ModelArchitecture):
            pass


def test_a_deprecated_hook_warns_when_implemented() -> None:
    project = "deprecation_demo"
    spec_marker, impl_marker = pluggy.HookspecMarker(project), pluggy.HookimplMarker(project)
    warning = deprecated_hook_warning(
        "register_old", Deprecation("0.1.1", "0.2.0", "implement register_new instead")
    )

    class Specs:
        @spec_marker(warn_on_impl=warning)
        def register_old(self) -> list[object]:
            """Deprecated."""
            return []

    class Plugin:
        @impl_marker
        def register_old(self) -> list[object]:
            return []

    pm = pluggy.PluginManager(project)
    pm.add_hookspecs(Specs)
    with pytest.warns(SDKDeprecationWarning, match=r"hook register_old\(\) is deprecated since"):
        pm.register(Plugin())
