"""``registry.toml``: the catalogue of known plugins (metadata only, never loads code).

It answers "which plugin provides X and how do I install it" for error messages and for
``engine plugins list --available``. Found at ``$ENGINE_REGISTRY`` or at the root of the
source checkout the engine runs from; an installed wheel without a checkout has an empty
catalogue and falls back to ``pip install engine-<name>`` hints.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from engine.plugins.errors import PluginError

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - Python 3.10
    import tomli as tomllib

ENV_REGISTRY = "ENGINE_REGISTRY"
STATUSES = ("stable", "experimental", "planned")


@dataclass(frozen=True)
class CatalogueEntry:
    """One ``[plugins.NAME]`` table of ``registry.toml``."""

    name: str
    distribution: str
    entry_point: str
    status: str
    provides: dict[str, list[str]] = field(default_factory=dict)
    path: Path | None = None
    sdk: str = ""
    hardware: tuple[str, ...] = ()
    description: str = ""
    # HF ``config.json`` architecture names a model plugin serves (``Qwen2ForCausalLM``).
    architectures: tuple[str, ...] = ()

    def install_command(self) -> str:
        """The command that installs this plugin (the source path for first-party ones)."""
        if self.path is not None:
            return f"pip install -e {self.path}"
        return f"pip install {self.distribution}"

    def install_hint(self) -> str:
        """:meth:`install_command`, with a warning for plugins that are only planned."""
        hint = self.install_command()
        if self.status == "planned":
            hint += " (registry.toml marks it 'planned': it may not be published yet)"
        return hint

    def as_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "distribution": self.distribution,
            "entry_point": self.entry_point,
            "status": self.status,
            "provides": self.provides,
            "path": str(self.path) if self.path else None,
            "sdk": self.sdk,
            "hardware": list(self.hardware),
            "description": self.description,
            "architectures": list(self.architectures),
            "install": self.install_command(),
        }


def _parse_entry(name: str, table: Mapping[str, Any], root: Path) -> CatalogueEntry:
    where = f"registry.toml [plugins.{name}]"
    for key in ("distribution", "entry_point", "status"):
        if not isinstance(table.get(key), str):
            raise PluginError(f"{where}: missing string field {key!r}; add it")
    if table["status"] not in STATUSES:
        raise PluginError(f"{where}: status {table['status']!r} must be one of {STATUSES}")
    provides = table.get("provides", {})
    if not isinstance(provides, dict) or not all(
        isinstance(v, list) and all(isinstance(n, str) for n in v) for v in provides.values()
    ):
        raise PluginError(f"{where}: provides must map a kind to a list of names")
    architectures = table.get("architectures", [])
    if not isinstance(architectures, list) or not all(isinstance(a, str) for a in architectures):
        raise PluginError(f"{where}: architectures must be a list of config.json names")
    path = table.get("path")
    return CatalogueEntry(
        name=name,
        distribution=table["distribution"],
        entry_point=table["entry_point"],
        status=table["status"],
        provides={kind: list(names) for kind, names in provides.items()},
        path=(root / path) if isinstance(path, str) else None,
        sdk=str(table.get("sdk", "")),
        hardware=tuple(table.get("hardware", ())),
        description=str(table.get("description", "")),
        architectures=tuple(architectures),
    )


class Catalogue:
    """The parsed catalogue; empty when no ``registry.toml`` is found."""

    def __init__(self, entries: list[CatalogueEntry], source: Path | None = None) -> None:
        self.entries = {entry.name: entry for entry in entries}
        self.source = source

    @classmethod
    def from_file(cls, path: Path) -> Catalogue:
        with path.open("rb") as f:
            data = tomllib.load(f)
        plugins = data.get("plugins", {})
        root = path.resolve().parent
        entries = [_parse_entry(name, table, root) for name, table in plugins.items()]
        return cls(entries, source=path)

    @classmethod
    def find(cls, env: Mapping[str, str] | None = None) -> Catalogue:
        """``$ENGINE_REGISTRY``, else the checkout's ``registry.toml``, else empty."""
        env = os.environ if env is None else env
        explicit = env.get(ENV_REGISTRY)
        if explicit:
            path = Path(explicit)
            if not path.is_file():
                raise PluginError(f"{ENV_REGISTRY}={explicit!r} is not a file; fix or unset it")
            return cls.from_file(path)
        # core/engine/plugins/catalogue.py -> the checkout root holds registry.toml.
        candidate = Path(__file__).resolve().parents[3] / "registry.toml"
        if candidate.is_file():
            return cls.from_file(candidate)
        return cls([])

    def get(self, name: str) -> CatalogueEntry | None:
        entry = self.entries.get(name)
        if entry is not None:
            return entry
        for entry in self.entries.values():
            if entry.distribution == name:
                return entry
        return None

    def providers_of(self, kind: str, name: str) -> list[CatalogueEntry]:
        """Entries whose ``provides[kind]`` lists ``name``."""
        return [e for e in self.entries.values() if name in e.provides.get(kind, [])]

    def providers_of_architecture(self, architecture: str) -> list[CatalogueEntry]:
        """Entries whose ``architectures`` list the HF architecture name."""
        return [e for e in self.entries.values() if architecture in e.architectures]

    def install_hint(self, name: str) -> str:
        """How to install plugin ``name``, from the catalogue or the naming convention."""
        entry = self.get(name)
        if entry is not None:
            return f"install it with: {entry.install_hint()}"
        return (
            f"{name!r} is not in registry.toml; install the distribution that provides it "
            f"(by convention `pip install engine-{name}`), and see "
            "`engine plugins list --available` for known plugins"
        )
