"""What the engine knows about one plugin: where it came from, its status and its specs."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from engine_sdk.specs import PluginSpec

# loaded: hooks called, specs registered; failed: import or a hook raised (see ``error``);
# blocked: ``no:NAME``; not_loaded: ENGINE_PLUGINS_AUTOLOAD=0 and not requested.
STATUSES = ("loaded", "failed", "blocked", "not_loaded")


@dataclass
class PluginInfo:
    """One discovered (or test-provided) plugin, as ``engine plugins list`` shows it."""

    name: str
    dist: str | None
    version: str | None
    status: str
    module: str = ""
    error: str | None = None
    specs: dict[str, list[PluginSpec]] = field(default_factory=dict)
    sdk_requirement: str | None = None
    sdk_compatible: bool | None = None
    requested: bool = False

    @property
    def owner(self) -> str:
        """How errors name this plugin: its distribution, or the plugin name for extras."""
        if self.dist:
            return f"{self.dist} (plugin {self.name!r})"
        return f"plugin {self.name!r}"

    def provides(self) -> dict[str, list[str]]:
        return {kind: [spec.name for spec in specs] for kind, specs in self.specs.items()}

    def as_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "distribution": self.dist,
            "version": self.version,
            "module": self.module,
            "status": self.status,
            "error": self.error,
            "requested": self.requested,
            "provides": self.provides(),
            "sdk_requirement": self.sdk_requirement,
            "sdk_compatible": self.sdk_compatible,
        }
