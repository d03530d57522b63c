"""One generic registry of plugin specs keyed by (kind, name), resolved lazily.

Adding a spec never imports its target. ``resolve`` imports it once, checks it against the
kind's base class (``engine_sdk.kinds``) and caches it. A name claimed twice within a kind,
or an HF architecture served twice, is an error naming both distributions.
"""

from __future__ import annotations

from typing import Any

from engine_sdk.kinds import check_target, import_target
from engine_sdk.specs import SPEC_KINDS, ModelArchitectureSpec, PluginSpec, PoolingModelSpec

from engine.plugins.errors import PluginError
from engine.plugins.info import PluginInfo


def _check_kind(kind: str) -> None:
    if kind not in SPEC_KINDS:
        raise PluginError(f"unknown plugin kind {kind!r}; use one of: {', '.join(SPEC_KINDS)}")


class Registry:
    """Specs of the loaded plugins, with the plugin that provided each."""

    def __init__(self) -> None:
        self._specs: dict[str, dict[str, tuple[PluginSpec, PluginInfo]]] = {
            kind: {} for kind in SPEC_KINDS
        }
        self._architectures: dict[str, tuple[ModelArchitectureSpec, PluginInfo]] = {}
        self._pooling_architectures: dict[str, tuple[PoolingModelSpec, PluginInfo]] = {}
        self._resolved: dict[tuple[str, str], Any] = {}

    def add(self, spec: PluginSpec, owner: PluginInfo) -> None:
        """Register ``spec`` from ``owner``; a duplicate name is a ``PluginError``."""
        kind = spec.kind
        _check_kind(kind)
        existing = self._specs[kind].get(spec.name)
        if existing is not None:
            raise PluginError(
                f"{kind} {spec.name!r} is provided twice: by {existing[1].owner} and by "
                f"{owner.owner}; uninstall one, or block one with --plugin no:NAME "
                f"(no:{existing[1].name} or no:{owner.name})"
            )
        if isinstance(spec, ModelArchitectureSpec | PoolingModelSpec):
            index: dict[str, Any] = (
                self._architectures
                if isinstance(spec, ModelArchitectureSpec)
                else self._pooling_architectures
            )
            for arch in spec.architectures:
                claimed = index.get(arch)
                if claimed is not None:
                    raise PluginError(
                        f"HF architecture {arch!r} is served twice: by {claimed[1].owner} "
                        f"({claimed[0].name!r}) and by {owner.owner} ({spec.name!r}); "
                        f"block one with --plugin no:{claimed[1].name} or "
                        f"--plugin no:{owner.name}"
                    )
            for arch in spec.architectures:
                index[arch] = (spec, owner)
        self._specs[kind][spec.name] = (spec, owner)

    def remove_owner(self, owner: PluginInfo) -> None:
        """Drop every spec ``owner`` provided (the plugin failed after loading)."""
        for kind_specs in self._specs.values():
            for name in [n for n, (_, o) in kind_specs.items() if o is owner]:
                del kind_specs[name]
        for arch in [a for a, (_, o) in self._architectures.items() if o is owner]:
            del self._architectures[arch]
        self._resolved = {
            key: obj for key, obj in self._resolved.items() if key[1] in self._specs[key[0]]
        }

    def specs(self, kind: str) -> list[PluginSpec]:
        _check_kind(kind)
        return [spec for spec, _ in self._specs[kind].values()]

    def names(self, kind: str) -> list[str]:
        _check_kind(kind)
        return sorted(self._specs[kind])

    def get_spec(self, kind: str, name: str) -> PluginSpec:
        """The spec ``(kind, name)``; the error names every known name of that kind."""
        _check_kind(kind)
        entry = self._specs[kind].get(name)
        if entry is None:
            known = ", ".join(self.names(kind)) or "none (no loaded plugin provides one)"
            raise PluginError(
                f"no {kind} named {name!r}; known {kind} names: {known}. "
                "`engine plugins list` shows what each plugin provides"
            )
        return entry[0]

    def owner(self, kind: str, name: str) -> PluginInfo:
        self.get_spec(kind, name)
        return self._specs[kind][name][1]

    def architecture(self, arch: str) -> tuple[ModelArchitectureSpec, PluginInfo] | None:
        return self._architectures.get(arch)

    def architectures(self) -> list[str]:
        return sorted(self._architectures)

    def pooling_architecture(self, arch: str) -> tuple[PoolingModelSpec, PluginInfo] | None:
        """The pooling model (embedder) serving HF architecture ``arch``, if any."""
        return self._pooling_architectures.get(arch)

    def pooling_architectures(self) -> list[str]:
        return sorted(self._pooling_architectures)

    def resolve(self, kind: str, name: str) -> Any:
        """Import the target of ``(kind, name)`` and check it (a class for all kinds but
        ``cli_command``, whose target is a ``typer.Typer`` app or a function)."""
        key = (kind, name)
        if key in self._resolved:
            return self._resolved[key]
        spec = self.get_spec(kind, name)
        owner = self.owner(kind, name)
        try:
            obj = import_target(spec.target)
        except Exception as exc:
            raise PluginError(
                f"{kind} {name!r} from {owner.owner}: cannot import {spec.target!r} "
                f"({type(exc).__name__}: {exc}); install what it needs or reinstall the "
                f"plugin, or pick another {kind}"
            ) from exc
        problem = check_target(kind, obj)
        if problem is not None:
            raise PluginError(
                f"{kind} {name!r} from {owner.owner} is broken: {problem}; report it to the "
                f"plugin's authors or block it with --plugin no:{owner.name}"
            )
        self._resolved[key] = obj
        return obj
