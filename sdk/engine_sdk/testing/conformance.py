"""The generic conformance suite every plugin should pass, whatever it provides.

Call :func:`check_plugin` (returns the problems found) or :func:`assert_plugin_conforms`
on a plugin module, or subclass :class:`PluginConformance` in a test file::

    import engine_myplugin.plugin
    from engine_sdk.testing import PluginConformance

    class TestConformance(PluginConformance):
        plugin = engine_myplugin.plugin

Checked: every implemented hook is one of ``engine_sdk.hookspecs`` and returns a list of
the kind's spec type; names are unique within a kind; every target imports and subclasses
the kind's base class (``engine_sdk.kinds``); the plugin module imports without torch.
Behaviour per kind (parsers, attention) has its own suites in ``engine_sdk.testing``.
"""

from __future__ import annotations

import os
import subprocess
import sys
import types
from collections import Counter
from dataclasses import dataclass, field
from typing import ClassVar

from engine_sdk.kinds import KIND_HOOKS, check_target, import_target
from engine_sdk.specs import SPEC_KINDS, PluginSpec
from engine_sdk.testing.plugin_manager import IsolatedPluginManager

__all__ = ["ConformanceReport", "PluginConformance", "assert_plugin_conforms", "check_plugin"]


@dataclass
class ConformanceReport:
    """What :func:`check_plugin` found: the specs per kind and every problem, as text."""

    plugin_name: str
    specs: dict[str, list[PluginSpec]] = field(default_factory=dict)
    hook_problems: list[str] = field(default_factory=list)
    name_problems: list[str] = field(default_factory=list)
    target_problems: list[str] = field(default_factory=list)

    @property
    def problems(self) -> list[str]:
        return self.hook_problems + self.name_problems + self.target_problems

    @property
    def ok(self) -> bool:
        return not self.problems

    def provides(self) -> dict[str, list[str]]:
        """``{kind: [names]}`` as ``registry.toml`` and ``engine plugins list`` show it."""
        return {kind: [spec.name for spec in specs] for kind, specs in self.specs.items()}


def _collect_specs(pm: IsolatedPluginManager, report: ConformanceReport) -> None:
    for kind in SPEC_KINDS:
        try:
            by_plugin = pm.specs_by_plugin(kind)
        except Exception as exc:  # a hook that raises or returns the wrong type
            report.hook_problems.append(f"{KIND_HOOKS[kind]}(): {exc}")
            continue
        specs = [spec for specs in by_plugin.values() for spec in specs]
        if specs:
            report.specs[kind] = specs


def _check_names(report: ConformanceReport) -> None:
    for kind, specs in report.specs.items():
        for name, count in Counter(spec.name for spec in specs).items():
            if count > 1:
                report.name_problems.append(
                    f"{kind} name {name!r} is returned {count} times; names must be unique"
                )
    architectures = Counter(
        arch
        for spec in report.specs.get("model_architecture", [])
        for arch in getattr(spec, "architectures", ())
    )
    for arch, count in architectures.items():
        if count > 1:
            report.name_problems.append(
                f"HF architecture {arch!r} is served by {count} model_architecture specs"
            )


def _check_targets(report: ConformanceReport) -> None:
    for kind, specs in report.specs.items():
        for spec in specs:
            try:
                obj = import_target(spec.target)
            except Exception as exc:
                report.target_problems.append(
                    f"{kind} {spec.name!r}: target {spec.target!r} does not import: "
                    f"{type(exc).__name__}: {exc}"
                )
                continue
            problem = check_target(kind, obj)
            if problem is not None:
                report.target_problems.append(f"{kind} {spec.name!r}: {problem}")


def check_plugin(plugin: object, *, check_targets: bool = True) -> ConformanceReport:
    """Run the generic checks on one plugin module or object; never raises for a problem."""
    pm = IsolatedPluginManager()
    name = getattr(plugin, "__name__", None) or type(plugin).__name__
    report = ConformanceReport(plugin_name=str(name))
    try:
        pm.register(plugin, name=report.plugin_name)
    except Exception as exc:  # unknown hook names, wrong hook signatures
        report.hook_problems.append(f"plugin does not register: {type(exc).__name__}: {exc}")
        return report
    _collect_specs(pm, report)
    _check_names(report)
    if check_targets:
        _check_targets(report)
    return report


def imports_torch(module_name: str) -> bool:
    """Whether importing ``module_name`` in a fresh interpreter imports torch."""
    code = f"import sys, {module_name}; print('torch' in sys.modules)"
    # The child sees this process's sys.path, so modules a test put there import too.
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in sys.path if p)}
    out = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
        env=env,
    )
    if out.returncode != 0:
        raise RuntimeError(f"importing {module_name} failed:\n{out.stderr}")
    return out.stdout.strip().endswith("True")


def assert_plugin_conforms(
    plugin: object, *, expected: dict[str, list[str]] | None = None
) -> ConformanceReport:
    """Raise ``AssertionError`` listing every problem; optionally compare what it provides."""
    report = check_plugin(plugin)
    problems = list(report.problems)
    if expected is not None and report.provides() != expected:
        problems.append(f"provides {report.provides()}, expected {expected}")
    if problems:
        listed = "\n  - ".join(problems)
        raise AssertionError(f"plugin {report.plugin_name} does not conform:\n  - {listed}")
    return report


class PluginConformance:
    """Subclass in a test file and set ``plugin`` (the entry-point module or object).

    ``expected`` (``{kind: [names]}``), when set, must equal what the hooks return.
    """

    plugin: ClassVar[object] = None
    expected: ClassVar[dict[str, list[str]] | None] = None

    def _report(self, check_targets: bool = False) -> ConformanceReport:
        assert self.plugin is not None, "set `plugin = <your entry-point module>`"
        return check_plugin(self.plugin, check_targets=check_targets)

    def test_hooks_return_spec_lists(self) -> None:
        report = self._report()
        assert not report.hook_problems, "\n".join(report.hook_problems)
        assert report.specs, "the plugin's hooks return no specs at all"

    def test_names_unique(self) -> None:
        report = self._report()
        assert not report.name_problems, "\n".join(report.name_problems)

    def test_targets_import_and_subclass(self) -> None:
        report = self._report(check_targets=True)
        assert not report.target_problems, "\n".join(report.target_problems)

    def test_provides_expected(self) -> None:
        if self.expected is None:
            return
        assert self._report().provides() == self.expected

    def test_plugin_module_does_not_import_torch(self) -> None:
        if not isinstance(self.plugin, types.ModuleType):
            return
        assert not imports_torch(self.plugin.__name__), (
            f"importing {self.plugin.__name__} imports torch; keep torch imports in the "
            "target modules (specs name them lazily as 'module:Class')"
        )
