"""registry.toml against plugins/*: what is listed exists, what exists is listed and true."""

from __future__ import annotations

from importlib import metadata
from pathlib import Path

import pytest
import tomllib
from engine.plugins import Catalogue
from engine_sdk import ENTRY_POINT_GROUP, SPEC_KINDS
from engine_sdk.testing import check_plugin

REPO_ROOT = Path(__file__).resolve().parents[2]
CATALOGUE = Catalogue.from_file(REPO_ROOT / "registry.toml")
PLUGIN_FOLDERS = sorted(p.parent for p in REPO_ROOT.glob("plugins/*/pyproject.toml"))


def _pyproject(folder: Path) -> dict[str, object]:
    return tomllib.loads((folder / "pyproject.toml").read_text())


def test_entries_are_well_formed() -> None:
    assert {"reference", "gguf", "awq", "fp8", "outlines", "triton"} <= set(CATALOGUE.entries)
    for entry in CATALOGUE.entries.values():
        assert entry.distribution == f"engine-{entry.name}", entry.name
        assert entry.entry_point == f"engine_{entry.name}.plugin", entry.name
        assert set(entry.provides) <= set(SPEC_KINDS), entry.name
        assert entry.provides, f"{entry.name}: provides is empty"
        assert entry.sdk, f"{entry.name}: sdk range missing"
        if entry.path is None:
            assert entry.status == "planned", f"{entry.name}: only planned entries lack a path"


def test_every_listed_path_exists() -> None:
    for entry in CATALOGUE.entries.values():
        if entry.path is not None:
            assert (entry.path / "pyproject.toml").is_file(), f"{entry.name}: {entry.path}"


def test_plugin_folders_exist() -> None:
    assert PLUGIN_FOLDERS, "plugins/ has no plugin folders"


@pytest.mark.parametrize("folder", PLUGIN_FOLDERS, ids=lambda p: p.name)
def test_every_plugin_folder_is_listed(folder: Path) -> None:
    project = _pyproject(folder)["project"]
    assert isinstance(project, dict)
    entry_points = project["entry-points"][ENTRY_POINT_GROUP]
    assert len(entry_points) == 1, f"{folder.name}: one engine.plugins entry point expected"
    ((name, value),) = entry_points.items()
    entry = CATALOGUE.get(name)
    assert entry is not None, f"plugins/{folder.name} (entry point {name!r}) missing in registry"
    assert entry.path == folder, f"registry path of {name!r} should be plugins/{folder.name}"
    assert entry.distribution == project["name"]
    assert entry.entry_point == value
    assert entry.status != "planned", f"{name!r} exists: mark it stable or experimental"
    requires = " ".join(project.get("dependencies", []))
    assert f"engine-sdk{entry.sdk}" in requires.replace(" ", ""), (
        f"{name!r}: registry sdk {entry.sdk!r} differs from the pyproject dependency"
    )


@pytest.mark.parametrize("folder", PLUGIN_FOLDERS, ids=lambda p: p.name)
def test_provides_matches_hooks(folder: Path) -> None:
    project = _pyproject(folder)["project"]
    assert isinstance(project, dict)
    try:
        metadata.distribution(str(project["name"]))
    except metadata.PackageNotFoundError:
        pytest.skip(f"{project['name']} is not installed (run scripts/dev-install.sh)")
    ((name, value),) = project["entry-points"][ENTRY_POINT_GROUP].items()
    (entry_point,) = [
        ep for ep in metadata.entry_points(group=ENTRY_POINT_GROUP) if ep.name == name
    ]
    report = check_plugin(entry_point.load(), check_targets=False)
    assert not report.problems, report.problems
    entry = CATALOGUE.get(name)
    assert entry is not None
    actual = {kind: sorted(names) for kind, names in report.provides().items()}
    listed = {kind: sorted(names) for kind, names in entry.provides.items()}
    assert actual == listed, f"registry.toml provides for {name!r} differs from its hooks"
    served = sorted(
        arch
        for spec in report.specs.get("model_architecture", [])
        for arch in getattr(spec, "architectures", ())
    )
    assert served == sorted(entry.architectures), (
        f"registry.toml architectures for {name!r} differ from its specs' architectures"
    )
