"""An isolated plugin manager for tests: only the plugins a test registers, no discovery.

It uses the same hookspecs and the same checks as the engine (``engine_sdk.kinds``) but
never reads entry points, so a test sees exactly the plugin objects or modules it gives.
"""

from __future__ import annotations

from typing import Any

import pluggy

from engine_sdk import hookspecs
from engine_sdk._markers import PROJECT_NAME
from engine_sdk.kinds import KIND_HOOKS, check_target, import_target, validate_hook_result
from engine_sdk.specs import SPEC_KINDS, PluginSpec

__all__ = ["IsolatedPluginManager"]


def _default_name(plugin: object) -> str:
    name = getattr(plugin, "__name__", None)
    if isinstance(name, str):
        return name
    return f"{type(plugin).__name__}-{id(plugin):x}"


class IsolatedPluginManager:
    """A pluggy manager with ``engine_sdk.hookspecs`` and only explicitly registered plugins.

    ``register(plugin)`` accepts a module or any object with ``@hookimpl`` methods.
    ``specs(kind)`` collects what every registered plugin's hook returns for that kind,
    checked to be a list of the kind's spec type; ``resolve(kind, name)`` imports a target
    and checks it subclasses the kind's base class.
    """

    def __init__(self) -> None:
        self.pluggy = pluggy.PluginManager(PROJECT_NAME)
        self.pluggy.add_hookspecs(hookspecs)

    def register(self, *plugins: object, name: str | None = None) -> IsolatedPluginManager:
        """Register plugin modules or objects; ``name`` only when registering one plugin."""
        if name is not None and len(plugins) != 1:
            raise ValueError("name= can only be given when registering exactly one plugin")
        for plugin in plugins:
            self.pluggy.register(plugin, name=name or _default_name(plugin))
        self.pluggy.check_pending()
        return self

    def plugin_names(self) -> list[str]:
        return [name for name, _ in self.pluggy.list_name_plugin()]

    def specs_by_plugin(self, kind: str) -> dict[str, list[PluginSpec]]:
        """``{plugin name: specs}`` for ``kind``; a plugin without that hook gives nothing."""
        if kind not in SPEC_KINDS:
            raise ValueError(f"unknown plugin kind {kind!r}; use one of: {sorted(SPEC_KINDS)}")
        hook_name = KIND_HOOKS[kind]
        result: dict[str, list[PluginSpec]] = {}
        for impl in getattr(self.pluggy.hook, hook_name).get_hookimpls():
            returned = impl.function()
            result[impl.plugin_name] = validate_hook_result(kind, returned, impl.plugin_name)
        return result

    def specs(self, kind: str) -> list[PluginSpec]:
        """Every spec of ``kind`` from every registered plugin, in registration order."""
        by_plugin = self.specs_by_plugin(kind)
        return [spec for name in self.plugin_names() for spec in by_plugin.get(name, [])]

    def all_specs(self) -> dict[str, list[PluginSpec]]:
        """``{kind: specs}`` for every kind with at least one spec."""
        return {kind: specs for kind in SPEC_KINDS if (specs := self.specs(kind))}

    def get_spec(self, kind: str, name: str) -> PluginSpec:
        matches = [spec for spec in self.specs(kind) if spec.name == name]
        if not matches:
            known = ", ".join(sorted(spec.name for spec in self.specs(kind))) or "none"
            raise LookupError(f"no {kind} named {name!r} is registered; known: {known}")
        if len(matches) > 1:
            raise LookupError(f"{len(matches)} registered plugins provide {kind} {name!r}")
        return matches[0]

    def resolve(self, kind: str, name: str) -> Any:
        """Import the target of spec ``(kind, name)`` and check it against the kind."""
        spec = self.get_spec(kind, name)
        obj = import_target(spec.target)
        problem = check_target(kind, obj)
        if problem is not None:
            raise TypeError(f"{kind} {name!r} (target {spec.target!r}): {problem}")
        return obj
