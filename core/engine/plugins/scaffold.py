"""``engine plugins new NAME --kind KIND``: write a plugin package from the templates.

The templates live in ``scaffold_templates/`` (package data): ``common/`` for every kind
(pyproject.toml, README.md, the package ``__init__``) and one folder per kind with the
entry-point module, the implementation and its tests. ``examples/plugin_template`` in the
repository is exactly what ``engine plugins new myplugin --kind tool_parser`` writes (a
test checks it). Tool and reasoning parsers and CLI commands come out working; the other
kinds are skeletons whose methods say ``TODO`` until written, and all of them pass the SDK
conformance suite as generated.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from string import Template

from engine_sdk.specs import SPEC_KINDS

from engine.plugins.errors import PluginError

__all__ = ["IMPL_MODULES", "ScaffoldNames", "write_plugin"]

TEMPLATES = Path(__file__).resolve().parent / "scaffold_templates"

# kind -> the module (in the plugin's package) holding the implementation.
IMPL_MODULES: dict[str, str] = {
    "attention_backend": "backend",
    "model_architecture": "model",
    "pooling_model": "model",
    "quantization_method": "quantization",
    "tool_parser": "tool_parser",
    "reasoning_parser": "reasoning_parser",
    "model_format": "model_format",
    "structured_output_backend": "grammar",
    "cli_command": "command",
}
_WORKING = {"tool_parser", "reasoning_parser", "cli_command"}
_NAME = re.compile(r"^[a-z][a-z0-9_]*$")


def _sdk_range(version: str) -> tuple[str, str]:
    """``0.1.1`` -> (``0.1``, ``0.2``); ``1.2.0`` -> (``1.2``, ``2``): the semver series."""
    major, minor = (int(part) for part in version.split(".")[:2])
    if major == 0:
        return f"0.{minor}", f"0.{minor + 1}"
    return f"{major}.{minor}", f"{major + 1}"


@dataclass(frozen=True)
class ScaffoldNames:
    """Every name the templates use, derived from the plugin name and kind."""

    name: str
    kind: str

    def mapping(self) -> dict[str, str]:
        import engine_sdk

        low, high = _sdk_range(engine_sdk.__version__)
        suffix = {"tool_parser": "_json", "reasoning_parser": "_tags"}.get(self.kind, "")
        camel = "".join(part.capitalize() for part in self.name.split("_"))
        return {
            "name": self.name,
            "kind": self.kind,
            "dist": f"engine-{self.name.replace('_', '-')}",
            "package": f"engine_{self.name}",
            "impl_module": IMPL_MODULES[self.kind],
            "spec_name": f"{self.name}{suffix}",
            "arch_name": f"{camel}ForCausalLM",
            "embed_arch_name": f"{camel}Model",
            "sdk_minor": low,
            "sdk_next_minor": high,
            "todo_note": ""
            if self.kind in _WORKING
            else " It is a skeleton: its methods raise\n  `NotImplementedError` (each says TODO) "
            "until you write them.",
        }


def _check(name: str, kind: str) -> None:
    if not _NAME.match(name):
        raise PluginError(
            f"plugin name {name!r} must be lower-case letters, digits and '_', starting with "
            "a letter (it becomes the package engine_NAME); for example: my_parser"
        )
    if kind not in SPEC_KINDS:
        raise PluginError(f"unknown kind {kind!r}; use one of: {', '.join(SPEC_KINDS)}")


def write_plugin(name: str, kind: str, parent: Path) -> Path:
    """Write plugin ``name`` of ``kind`` into ``parent/engine-<name>``; returns that folder."""
    _check(name, kind)
    values = ScaffoldNames(name, kind).mapping()
    folder = parent / values["dist"]
    if folder.exists():
        raise PluginError(f"{folder} already exists; pass another --dir or remove it")
    package = values["package"]
    files = {
        "pyproject.toml": TEMPLATES / "common" / "pyproject.toml.tmpl",
        "README.md": TEMPLATES / "common" / "README.md.tmpl",
        f"{package}/__init__.py": TEMPLATES / "common" / "__init__.py.tmpl",
        f"{package}/plugin.py": TEMPLATES / kind / "plugin.py.tmpl",
        f"{package}/{values['impl_module']}.py": TEMPLATES / kind / "impl.py.tmpl",
        f"tests/test_{name}.py": TEMPLATES / kind / "test.py.tmpl",
    }
    for relative, template in files.items():
        target = folder / relative
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(Template(template.read_text()).substitute(values))
    return folder
