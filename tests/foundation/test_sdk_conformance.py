"""engine_sdk.testing: the generic conformance suite catches each kind of broken plugin."""

from __future__ import annotations

import sys
import textwrap
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from types import ModuleType

import pytest
from engine_sdk import (
    SPEC_KINDS,
    ModelArchitectureSpec,
    ReasoningParserSpec,
    ToolParserSpec,
    hookimpl,
    hookspecs,
)
from engine_sdk.kinds import KIND_BASE_CLASSES, KIND_HOOKS, check_target, load_base_class
from engine_sdk.testing import (
    IsolatedPluginManager,
    PluginConformance,
    assert_plugin_conforms,
    check_plugin,
)

TARGETS = """
from engine_sdk.interfaces.reasoning_parser import ReasoningParser

class Good(ReasoningParser):
    def extract_reasoning(self, model_output):
        return None, model_output
    def extract_reasoning_streaming(self, previous_text, current_text, delta_text):
        return None
    def is_reasoning_end(self, text):
        return True

class Plain:
    pass
"""


@pytest.fixture
def targets(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    name = f"conf_targets_{uuid.uuid4().hex[:8]}"
    (tmp_path / f"{name}.py").write_text(textwrap.dedent(TARGETS))
    monkeypatch.syspath_prepend(str(tmp_path))
    yield name
    sys.modules.pop(name, None)


def make_plugin(**hooks: object) -> ModuleType:
    module = ModuleType(f"plugin_{uuid.uuid4().hex[:6]}")
    for hook_name, value in hooks.items():

        def impl(_value: object = value) -> object:
            return _value

        impl.__name__ = hook_name
        setattr(module, hook_name, hookimpl(impl))
    return module


def test_kind_tables_cover_every_hook() -> None:
    assert set(KIND_HOOKS) == set(SPEC_KINDS) == set(KIND_BASE_CLASSES)
    assert sorted(KIND_HOOKS.values()) == sorted(hookspecs.HOOK_NAMES)
    for kind in SPEC_KINDS:
        base = load_base_class(kind)
        if kind == "cli_command":
            assert base is None
        else:
            assert base is not None and base.__name__ in str(KIND_BASE_CLASSES[kind])
    assert check_target("cli_command", lambda: None) is None
    assert check_target("cli_command", 3) is not None


def test_good_plugin_conforms(targets: str) -> None:
    good = make_plugin(register_reasoning_parsers=[ReasoningParserSpec("think", f"{targets}:Good")])
    report = assert_plugin_conforms(good, expected={"reasoning_parser": ["think"]})
    assert report.ok and report.provides() == {"reasoning_parser": ["think"]}
    with pytest.raises(AssertionError, match="expected"):
        assert_plugin_conforms(good, expected={"reasoning_parser": ["other"]})


def test_wrong_return_types(targets: str) -> None:
    not_a_list = make_plugin(register_reasoning_parsers=ReasoningParserSpec("a", f"{targets}:Good"))
    assert any("return a list" in p for p in check_plugin(not_a_list).hook_problems)
    wrong_spec = make_plugin(register_reasoning_parsers=[ToolParserSpec("a", f"{targets}:Good")])
    assert any("ReasoningParserSpec" in p for p in check_plugin(wrong_spec).hook_problems)


def test_duplicate_names(targets: str) -> None:
    dup = make_plugin(
        register_reasoning_parsers=[
            ReasoningParserSpec("a", f"{targets}:Good"),
            ReasoningParserSpec("a", f"{targets}:Good"),
        ],
        register_model_architectures=[
            ModelArchitectureSpec("m1", "x:Y", architectures=("Arch",)),
            ModelArchitectureSpec("m2", "x:Z", architectures=("Arch",)),
        ],
    )
    problems = check_plugin(dup, check_targets=False).name_problems
    assert any("'a' is returned 2 times" in p for p in problems)
    assert any("'Arch' is served by 2" in p for p in problems)


def test_bad_targets(targets: str) -> None:
    bad = make_plugin(
        register_reasoning_parsers=[
            ReasoningParserSpec("missing_module", "no_such_module_zz:Good"),
            ReasoningParserSpec("missing_attr", f"{targets}:Nope"),
            ReasoningParserSpec("not_subclass", f"{targets}:Plain"),
        ]
    )
    problems = check_plugin(bad).target_problems
    assert len(problems) == 3
    assert "does not import" in problems[0] and "ModuleNotFoundError" in problems[0]
    assert "no attribute 'Nope'" in problems[1]
    assert "does not subclass engine_sdk.interfaces.reasoning_parser" in problems[2]
    with pytest.raises(AssertionError, match="does not conform"):
        assert_plugin_conforms(bad)


def test_unknown_hook_is_reported() -> None:
    typo = make_plugin(register_tool_parser=[])  # missing the final "s"
    report = check_plugin(typo)
    assert any("does not register" in p for p in report.hook_problems)


def test_isolated_manager_sees_only_registered(targets: str) -> None:
    pm = IsolatedPluginManager()
    assert pm.specs("reasoning_parser") == []
    pm.register(
        make_plugin(register_reasoning_parsers=[ReasoningParserSpec("x", f"{targets}:Good")])
    )
    assert [s.name for s in pm.specs("reasoning_parser")] == ["x"]
    assert pm.resolve("reasoning_parser", "x").__name__ == "Good"
    with pytest.raises(LookupError, match="known: x"):
        pm.get_spec("reasoning_parser", "y")


def test_fixture_is_isolated(engine_plugin_manager: IsolatedPluginManager) -> None:
    # first-party plugins are installed, but the fixture discovers nothing
    assert engine_plugin_manager.plugin_names() == []
    assert engine_plugin_manager.all_specs() == {}


def test_conformance_class_fails_on_broken_plugin(targets: str) -> None:
    class Broken(PluginConformance):
        plugin = make_plugin(
            register_reasoning_parsers=[ReasoningParserSpec("p", f"{targets}:Plain")]
        )

    Broken().test_hooks_return_spec_lists()
    Broken().test_names_unique()
    with pytest.raises(AssertionError, match="does not subclass"):
        Broken().test_targets_import_and_subclass()


def test_torch_import_in_entry_module_is_caught(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    name = f"heavy_plugin_{uuid.uuid4().hex[:6]}"
    (tmp_path / f"{name}.py").write_text("import torch\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    module = ModuleType(name)

    class Heavy(PluginConformance):
        plugin = module

    with pytest.raises(AssertionError, match="imports torch"):
        Heavy().test_plugin_module_does_not_import_torch()


def test_tiny_model_dir_fixture(tiny_model_dir: Callable[..., Path]) -> None:
    import json

    path = tiny_model_dir("Qwen3ForCausalLM", num_hidden_layers=1)
    config = json.loads((path / "config.json").read_text())
    assert config["architectures"] == ["Qwen3ForCausalLM"]
    assert config["num_hidden_layers"] == 1
    assert any(path.glob("*.safetensors"))
    assert tiny_model_dir("Qwen3ForCausalLM") != path  # a fresh folder per call
