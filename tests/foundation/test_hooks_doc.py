"""docs/plugins/hooks.md documents every hookspec with its exact signature."""

from __future__ import annotations

import importlib.util
import inspect
from pathlib import Path
from types import ModuleType

from engine_sdk import hookspecs

REPO_ROOT = Path(__file__).resolve().parents[2]
DOC = REPO_ROOT / "docs" / "plugins" / "hooks.md"


def _generator() -> ModuleType:
    spec = importlib.util.spec_from_file_location(
        "gen_hooks_doc", REPO_ROOT / "scripts/gen_hooks_doc.py"
    )
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_every_hookspec_is_documented_with_its_signature() -> None:
    text = DOC.read_text()
    gen = _generator()
    hooks = [
        name
        for name, fn in inspect.getmembers(hookspecs, inspect.isfunction)
        if hasattr(fn, "engine_spec")
    ]
    assert sorted(hooks) == sorted(hookspecs.HOOK_NAMES)
    for name in hooks:
        function = getattr(hookspecs, name)
        signature = gen.hook_signature(function)
        assert f"\n{signature}\n" in text, f"{name}: signature {signature!r} not in hooks.md"
        first_doc_line = inspect.cleandoc(function.__doc__).splitlines()[0]
        assert first_doc_line in text, f"{name}: docstring not in hooks.md"


def test_signature_is_exact() -> None:
    gen = _generator()
    sig = gen.hook_signature(hookspecs.register_tool_parsers)
    assert sig == "def register_tool_parsers() -> list[ToolParserSpec]"


def test_hooks_md_is_generated_from_code() -> None:
    assert DOC.read_text() == _generator().render(), (
        "docs/plugins/hooks.md is out of date: run python scripts/gen_hooks_doc.py"
    )


def test_every_hookspec_docstring_follows_the_template() -> None:
    sections = ("When called:", "Returns:", "Conflicts:", "Since: engine-sdk ")
    for name in hookspecs.HOOK_NAMES:
        doc = inspect.cleandoc(getattr(hookspecs, name).__doc__ or "")
        positions = [doc.find(f"\n{section}") for section in sections]
        assert all(p > 0 for p in positions), f"{name}: missing one of {sections}"
        assert positions == sorted(positions), f"{name}: sections out of order"
