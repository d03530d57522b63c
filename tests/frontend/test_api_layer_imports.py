"""The API layer (``engine.entrypoints``) talks to the engine through the EngineClient seam
and gets parser classes from the plugin layer's facade: no module of it imports scheduler
records (``engine.core``) or the plugin manager. Read from the source's import statements
(every one, including those inside functions), so a new reach into the internals fails."""

from __future__ import annotations

import ast
from pathlib import Path

import engine.entrypoints

API_ROOT = Path(engine.entrypoints.__file__).parent
FORBIDDEN_MODULES = ("engine.core", "engine.plugins.manager")
FORBIDDEN_NAMES = {"PluginManager"}


def _imports(path: Path) -> list[tuple[str, set[str]]]:
    found = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.append((node.module, {alias.name for alias in node.names}))
        elif isinstance(node, ast.Import):
            found += [(alias.name, set()) for alias in node.names]
    return found


def _offences(path: Path) -> list[str]:
    bad = []
    for module, names in _imports(path):
        if any(module == m or module.startswith(m + ".") for m in FORBIDDEN_MODULES):
            bad.append(module)
        if module.startswith("engine") and names & FORBIDDEN_NAMES:
            bad.append(f"{module}: {sorted(names & FORBIDDEN_NAMES)}")
    return bad


def test_the_api_imports_no_scheduler_records_and_no_plugin_manager() -> None:
    files = sorted(API_ROOT.rglob("*.py"))
    assert len(files) > 20  # the whole API package is read
    offences = {str(p.relative_to(API_ROOT)): bad for p in files if (bad := _offences(p))}
    assert offences == {}


def test_the_check_sees_an_offending_import(tmp_path: Path) -> None:
    sample = tmp_path / "sample.py"
    sample.write_text(
        "def f():\n"
        "    from engine.plugins import PluginManager\n"
        "    from engine.core.scheduler_output import Logprobs\n"
    )
    assert _offences(sample) == [
        "engine.plugins: ['PluginManager']",
        "engine.core.scheduler_output",
    ]
