"""The plugin manager: discover, activate, load plugins and answer what the core asks.

``PluginManager.load(...)`` is the only way in; there is no module-global instance. It
reads entry points (group ``engine.plugins``), applies ``--plugin`` / ``ENGINE_PLUGINS``
activation, imports the active plugins, calls every hook once per plugin and registers the
returned specs. A requested plugin that is missing or broken is an error; an autoloaded
one that fails is recorded as ``failed`` and the engine goes on without it.
"""

from __future__ import annotations

import logging
import os
import sys
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING

import pluggy
from engine_sdk import PROJECT_NAME, hookspecs
from engine_sdk.kinds import KIND_HOOKS, validate_hook_result
from engine_sdk.specs import (
    SPEC_KINDS,
    AttentionBackendSpec,
    PluginSpec,
    QuantizationMethodSpec,
)

from engine.plugins.activation import Activation, parse_activation
from engine.plugins.capabilities import (
    AttentionNeeds,
    QuantizationNeeds,
    quantization_refusals,
)
from engine.plugins.catalogue import Catalogue
from engine.plugins.discovery import Candidate, discover_entry_points
from engine.plugins.errors import PluginError
from engine.plugins.info import PluginInfo
from engine.plugins.preflight import missing_dependencies, sdk_refusal
from engine.plugins.registry import Registry
from engine.plugins.selection import rank_backends, refusals_text
from engine.plugins.versions import sdk_requirement, specifier_contains

if TYPE_CHECKING:
    from engine_sdk.interfaces.attention import AttentionBackend
    from engine_sdk.interfaces.model import ModelArchitecture
    from engine_sdk.interfaces.quantization import QuantizationConfig

logger = logging.getLogger(__name__)


def _sdk_version() -> str:
    import engine_sdk

    version: str = engine_sdk.__version__
    return version


def _extra_name(plugin: object) -> str:
    name = getattr(plugin, "__name__", None)
    return name if isinstance(name, str) else f"{type(plugin).__name__}-{id(plugin):x}"


class PluginManager:
    """Loaded plugins and their specs. Build one with :meth:`load`."""

    def __init__(self, activation: Activation, catalogue: Catalogue) -> None:
        self.activation = activation
        self.catalogue = catalogue
        self.registry = Registry()
        self.hooks = pluggy.PluginManager(PROJECT_NAME)
        self.hooks.add_hookspecs(hookspecs)
        self._plugins: list[PluginInfo] = []
        self._candidates: dict[str, Candidate] = {}
        if activation.trace:
            self.hooks.trace.root.setwriter(
                lambda message: sys.stderr.write(f"[engine.plugins] {message}")
            )
            self.hooks.enable_tracing()

    # ------------------------------------------------------------------ loading

    @classmethod
    def load(
        cls,
        requested: Sequence[str] = (),
        env: Mapping[str, str] | None = None,
        extra_plugins: Sequence[object] = (),
        *,
        discover: bool = True,
        catalogue: Catalogue | None = None,
        report_failures: bool = False,
    ) -> PluginManager:
        """Discover and load plugins; ``extra_plugins`` are modules/objects (for tests).

        ``discover=False`` skips entry points so only ``extra_plugins`` load.
        ``report_failures`` logs one warning per failed plugin: the engine's startup sets
        it, so the report appears once and not again in each process that loads plugins.
        """
        env = os.environ if env is None else env
        activation = parse_activation(requested, env)
        pm = cls(activation, catalogue if catalogue is not None else Catalogue.find(env))
        candidates = discover_entry_points() if discover else []
        extra_names = [_extra_name(plugin) for plugin in extra_plugins]
        pm._check_requested(candidates, extra_names)
        pm._check_entry_point_names(candidates)
        for candidate in candidates:
            pm._load_candidate(candidate)
        for plugin, name in zip(extra_plugins, extra_names, strict=True):
            info = PluginInfo(name=name, dist=None, version=None, status="loaded")
            info.requested = name in activation.requested
            pm._plugins.append(info)
            pm._activate(info, plugin)
        if report_failures:
            pm.report_failures()
        return pm

    def register_local(self, name: str, source: str, specs: Sequence[PluginSpec]) -> PluginInfo:
        """Register specs from local code the user named on the command line (for example
        ``--tool-parser-plugin FILE``) as plugin ``name``; duplicates are a ``PluginError``."""
        info = PluginInfo(
            name=name, dist=None, version=None, status="loaded", module=source, requested=True
        )
        for spec in specs:
            self.registry.add(spec, info)
            info.specs.setdefault(spec.kind, []).append(spec)
        self._plugins.append(info)
        return info

    def report_failures(self) -> None:
        """Log one warning per failed plugin: its name, the cause and what to do."""
        for info in self._plugins:
            if info.status == "failed":
                logger.warning(
                    "plugin %s failed and is not used: %s (`engine plugins list` shows it; "
                    "block it with --plugin no:%s to silence this)",
                    info.owner,
                    info.error,
                    info.name,
                )

    def _check_requested(self, candidates: list[Candidate], extra_names: list[str]) -> None:
        available = {c.name for c in candidates} | {c.dist for c in candidates if c.dist}
        available |= set(extra_names)
        for name in self.activation.requested:
            if name not in available:
                raise PluginError(
                    f"plugin {name!r} was requested (--plugin / ENGINE_PLUGINS) but is not "
                    f"installed; {self.catalogue.install_hint(name)}"
                )

    def _check_entry_point_names(self, candidates: list[Candidate]) -> None:
        by_name: dict[str, Candidate] = {}
        for candidate in candidates:
            if self._is_blocked(candidate):
                continue
            other = by_name.get(candidate.name)
            if other is not None:
                raise PluginError(
                    f"plugin name {candidate.name!r} is registered by two distributions: "
                    f"{other.dist} and {candidate.dist}; uninstall one of them"
                )
            by_name[candidate.name] = candidate

    def _is_blocked(self, candidate: Candidate) -> bool:
        return candidate.name in self.activation.blocked or (
            candidate.dist is not None and candidate.dist in self.activation.blocked
        )

    def _is_requested(self, candidate: Candidate) -> bool:
        return candidate.name in self.activation.requested or (
            candidate.dist is not None and candidate.dist in self.activation.requested
        )

    def _load_candidate(self, candidate: Candidate) -> None:
        requirement = sdk_requirement(list(candidate.requires))
        info = PluginInfo(
            name=candidate.name,
            dist=candidate.dist,
            version=candidate.version,
            status="not_loaded",
            module=candidate.value,
            sdk_requirement=requirement,
            requested=self._is_requested(candidate),
        )
        if requirement is not None:
            try:
                info.sdk_compatible = specifier_contains(requirement, _sdk_version())
            except ValueError:
                info.sdk_compatible = None
        self._plugins.append(info)
        self._candidates[candidate.name] = candidate
        if self._is_blocked(candidate):
            info.status = "blocked"
        elif self.activation.autoload or info.requested:
            self._import_and_activate(info, candidate)

    def _import_and_activate(self, info: PluginInfo, candidate: Candidate) -> None:
        refusal = sdk_refusal(info.name, info.dist, info.sdk_requirement, _sdk_version())
        if refusal is not None:
            self._fail(info, refusal, fix="")
            return
        missing = missing_dependencies(candidate.requires)
        if missing:
            quoted = " ".join(f"'{m.split(' (installed')[0]}'" for m in missing)
            self._fail(
                info,
                f"missing dependencies: {', '.join(missing)}",
                fix=f"install them: pip install {quoted}",
            )
            return
        try:
            plugin = candidate.entry_point.load()
        except Exception as exc:
            self._fail(info, f"import of {candidate.value!r} failed: {type(exc).__name__}: {exc}")
            return
        self._activate(info, plugin)

    def _fail(self, info: PluginInfo, error: str, fix: str | None = None) -> None:
        """Record ``info`` as failed; a plugin the user required is a ``PluginError``."""
        info.status = "failed"
        info.error = error
        if info.requested:
            if fix is None:
                fix = f"reinstall it ({self.catalogue.install_hint(info.name)})"
            todo = f"; {fix}" if fix else ""
            raise PluginError(
                f"plugin {info.name!r} ({info.dist}) was requested but cannot load: {error}"
                f"{todo}; or drop --plugin {info.name}"
            )

    def mark_failed(self, kind: str, name: str, error: str) -> None:
        """A spec's target failed when the core used it: its plugin is failed from now on.

        Its specs leave the registry so later lookups skip them; a required plugin raises.
        """
        info = self.registry.owner(kind, name)
        self.registry.remove_owner(info)
        logger.warning("plugin %s failed and is not used: %s", info.owner, error)
        self._fail(info, error)

    def _activate(self, info: PluginInfo, plugin: object) -> None:
        """Register with pluggy, call each hook for this plugin alone, register its specs."""
        try:
            self.hooks.register(plugin, name=info.name)
            self.hooks.check_pending()
        except Exception as exc:
            if self.hooks.is_registered(plugin):
                self.hooks.unregister(plugin)
            self._fail(info, f"invalid hooks: {type(exc).__name__}: {exc}")
            return
        others = [p for p in self.hooks.get_plugins() if p is not plugin]
        specs: dict[str, list[PluginSpec]] = {}
        try:
            for kind, hook_name in KIND_HOOKS.items():
                caller = self.hooks.subset_hook_caller(hook_name, remove_plugins=others)
                for result in caller():
                    specs.setdefault(kind, []).extend(validate_hook_result(kind, result, info.name))
        except Exception as exc:
            self.hooks.unregister(plugin)
            self._fail(
                info,
                f"a hook failed: {type(exc).__name__}: {exc}",
                fix=f"report it to the authors of {info.dist or info.name}",
            )
            return
        info.specs = {kind: found for kind, found in specs.items() if found}
        for kind_specs in info.specs.values():
            for spec in kind_specs:
                self.registry.add(spec, info)
        info.status = "loaded"

    # ------------------------------------------------------------------ queries

    @property
    def plugins(self) -> list[PluginInfo]:
        return list(self._plugins)

    def get_plugin(self, name: str) -> PluginInfo | None:
        for info in self._plugins:
            if name in (info.name, info.dist):
                return info
        return None

    def describe(self) -> str:
        """One line for the startup log: the plugins loaded (``--plugin`` ones marked), then
        those blocked, failed or not loaded. Loaded means available to the engine: a
        quantization or model plugin is used only when the checkpoint or a flag asks for it."""
        groups: dict[str, list[str]] = {}
        for info in self._plugins:
            label = info.name + (" (--plugin)" if info.requested else "")
            groups.setdefault(info.status, []).append(label)
        parts = [f"{status}: {', '.join(names)}" for status, names in groups.items()]
        return "; ".join(parts) or "none"

    def worker_args(self) -> list[str]:
        """``--plugin`` values that make a worker process load the same set of plugins."""
        loaded = [info.name for info in self._plugins if info.status == "loaded" and info.dist]
        blocked = [f"no:{info.name}" for info in self._plugins if info.status != "loaded"]
        return loaded + blocked

    def specs(self, kind: str) -> list[PluginSpec]:
        return self.registry.specs(kind)

    def find_model_architecture(self, arch: str) -> type[ModelArchitecture]:
        """The ``ModelArchitecture`` subclass serving HF architecture name ``arch``."""
        found = self.registry.architecture(arch)
        if found is None:
            known = ", ".join(self.registry.architectures()) or "none"
            providers = self.catalogue.providers_of_architecture(arch)
            if providers:
                hint = "registry.toml lists it in: " + "; ".join(
                    f"{e.name} ({e.install_hint()})" for e in providers
                )
            else:
                hint = "registry.toml knows no plugin for it (`engine plugins list --available`)"
            raise PluginError(
                f"no loaded plugin serves the model architecture {arch!r} (config.json "
                f"'architectures'); installed architectures: {known}; {hint}; or check "
                "`engine plugins list` for failed plugins"
            )
        model_cls: type[ModelArchitecture] = self.registry.resolve(
            "model_architecture", found[0].name
        )
        return model_cls

    def attention_specs(self) -> list[AttentionBackendSpec]:
        specs = self.registry.specs("attention_backend")
        return [s for s in specs if isinstance(s, AttentionBackendSpec)]

    def quantization_specs(self) -> list[QuantizationMethodSpec]:
        specs = self.registry.specs("quantization_method")
        return [s for s in specs if isinstance(s, QuantizationMethodSpec)]

    def select_attention_backend(
        self, needs: AttentionNeeds, name: str | None = None
    ) -> type[AttentionBackend]:
        """The named backend if it fits, else the highest-priority fitting one.

        The only place the attention backend is chosen; a refusal lists every reason of
        every backend (the same lines ``engine plugins list --explain`` prints).
        """
        fitting, rejected = rank_backends(self.attention_specs(), needs)
        wanted = needs.describe()
        if name is not None:
            self.registry.get_spec("attention_backend", name)
            if name in rejected:
                others = ", ".join(s.name for s in fitting) or "none"
                raise PluginError(
                    f"attention backend {name!r} cannot run {wanted}:\n"
                    f"{refusals_text({name: rejected[name]})}\n"
                    f"Backends that fit: {others}; change --attention-backend, or --dtype / "
                    "--block-size / --kv-cache-dtype"
                )
            chosen = name
        elif fitting:
            chosen = fitting[0].name
        else:
            why = refusals_text(rejected) or "  - no attention backend is loaded"
            raise PluginError(
                f"no attention backend fits {wanted}:\n{why}\nChange --dtype / --block-size "
                "/ --kv-cache-dtype / --device, or install a backend plugin for this hardware "
                "(`engine plugins list --available --kind attention_backend`)"
            )
        backend: type[AttentionBackend] = self.registry.resolve("attention_backend", chosen)
        return backend

    def check_quantization(self, method: str, needs: QuantizationNeeds) -> None:
        """Refuse ``method`` on this device from its spec's ``devices`` and
        ``min_capability``; the error lists the reasons and what to change."""
        spec = self.registry.get_spec("quantization_method", method)
        assert isinstance(spec, QuantizationMethodSpec)
        reasons = quantization_refusals(spec, needs)
        if reasons:
            raise PluginError(
                f"quantization {method!r} cannot run on {needs.device}: {'; '.join(reasons)}. "
                "Use --device cpu for the reference path, another GPU, or an unquantized "
                "checkpoint"
            )

    def require_quant_method(self, quant_method: str) -> type[QuantizationConfig]:
        """The ``QuantizationConfig`` subclass for ``quant_method``; loads an installed but
        not-yet-loaded provider (a checkpoint pulls in its method's plugin)."""
        kind = "quantization_method"
        if quant_method in self.registry.names(kind):
            return self._resolve_quant(quant_method)
        providers = self.catalogue.providers_of(kind, quant_method)
        for entry in providers:
            info = self.get_plugin(entry.name)
            if info is None:
                continue
            if info.status == "not_loaded":
                info.requested = True
                self._import_and_activate(info, self._candidates[info.name])
                return self._resolve_quant(quant_method)
            if info.status == "blocked":
                raise PluginError(
                    f"quantization method {quant_method!r} needs plugin {info.name!r}, which "
                    f"is blocked (no:{info.name}); remove that from --plugin / ENGINE_PLUGINS"
                )
            if info.status == "failed":
                raise PluginError(
                    f"quantization method {quant_method!r} needs plugin {info.name!r}, which "
                    f"failed to load: {info.error}"
                )
        # Not in the catalogue: a third-party provider may be installed but not loaded
        # (ENGINE_PLUGINS_AUTOLOAD=0); load those now, each failure stays non-fatal.
        for info in self._plugins:
            if info.status == "not_loaded" and info.name in self._candidates:
                self._import_and_activate(info, self._candidates[info.name])
        if quant_method in self.registry.names(kind):
            return self._resolve_quant(quant_method)
        known = ", ".join(self.registry.names(kind)) or "none"
        if providers:
            hint = "; ".join(f"plugin {e.name!r}: {e.install_hint()}" for e in providers)
            todo = f"install its plugin: {hint}"
        else:
            todo = (
                "no known plugin provides it (registry.toml); install a third-party plugin "
                "for it or use an unquantized checkpoint"
            )
        raise PluginError(
            f"quantization method {quant_method!r} is not provided by any loaded plugin "
            f"(loaded methods: {known}); {todo}"
        )

    def _resolve_quant(self, quant_method: str) -> type[QuantizationConfig]:
        config_cls: type[QuantizationConfig] = self.registry.resolve(
            "quantization_method", quant_method
        )
        return config_cls

    def kinds(self) -> list[str]:
        return list(SPEC_KINDS)
