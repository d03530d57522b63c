"""PluginManager in-process: activation, registry, duplicates, resolution, selection."""

from __future__ import annotations

import sys
import textwrap
import uuid
from pathlib import Path
from types import ModuleType

import pytest
from engine.plugins import Catalogue, CatalogueEntry, PluginError, PluginManager
from engine.plugins.activation import parse_activation
from engine.plugins.capabilities import AttentionNeeds
from engine_sdk import (
    AttentionBackendSpec,
    ModelArchitectureSpec,
    QuantizationMethodSpec,
    ReasoningParserSpec,
    ToolParserSpec,
    hookimpl,
)

TARGETS = """
from engine_sdk.interfaces.attention import AttentionBackend
from engine_sdk.interfaces.reasoning_parser import ReasoningParser


class Reasoner(ReasoningParser):
    def extract_reasoning(self, model_output):
        return None, model_output

    def extract_reasoning_streaming(self, previous_text, current_text, delta_text):
        return None

    def is_reasoning_end(self, text):
        return True


class NotAParser:
    pass


class CpuBackend(AttentionBackend):
    pass


class FastBackend(AttentionBackend):
    pass
"""


@pytest.fixture
def targets(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> str:
    """A fresh importable module holding target classes; returns its name."""
    name = f"fm_targets_{uuid.uuid4().hex[:8]}"
    (tmp_path / f"{name}.py").write_text(textwrap.dedent(TARGETS))
    monkeypatch.syspath_prepend(str(tmp_path))
    yield name
    sys.modules.pop(name, None)


def plugin(name: str, **hooks: list[object]) -> ModuleType:
    """A plugin module named ``name`` whose hooks return the given spec lists."""
    module = ModuleType(name)
    for hook_name, specs in hooks.items():

        def impl(_specs: list[object] = specs) -> list[object]:
            return list(_specs)

        impl.__name__ = hook_name
        setattr(module, hook_name, hookimpl(impl))
    return module


def load(*plugins: object, **kwargs: object) -> PluginManager:
    kwargs.setdefault("env", {})
    kwargs.setdefault("catalogue", Catalogue([]))
    return PluginManager.load(extra_plugins=plugins, discover=False, **kwargs)  # type: ignore[arg-type]


def test_specs_and_resolve(targets: str) -> None:
    p = plugin(
        "p1",
        register_reasoning_parsers=[ReasoningParserSpec("think", f"{targets}:Reasoner")],
        register_tool_parsers=[ToolParserSpec("tp", f"{targets}:Reasoner")],
    )
    pm = load(p)
    assert [s.name for s in pm.registry.specs("reasoning_parser")] == ["think"]
    assert pm.registry.get_spec("reasoning_parser", "think").target == f"{targets}:Reasoner"
    cls = pm.registry.resolve("reasoning_parser", "think")
    assert cls.__name__ == "Reasoner"
    assert cls().extract_reasoning("x") == (None, "x")
    assert pm.plugins[0].status == "loaded"
    assert pm.plugins[0].provides() == {"tool_parser": ["tp"], "reasoning_parser": ["think"]}
    # a tool_parser target that is a ReasoningParser fails the subclass check
    with pytest.raises(PluginError, match="does not subclass .*ToolParser.*no:p1"):
        pm.registry.resolve("tool_parser", "tp")


def test_unknown_name_lists_known(targets: str) -> None:
    pm = load(plugin("p1", register_reasoning_parsers=[ReasoningParserSpec("a", "m:A")]))
    with pytest.raises(PluginError, match="no reasoning_parser named 'zzz'; known .*: a"):
        pm.registry.get_spec("reasoning_parser", "zzz")
    with pytest.raises(PluginError, match="unknown plugin kind 'bogus'"):
        pm.registry.specs("bogus")


def test_unimportable_target_names_plugin() -> None:
    pm = load(plugin("p1", register_reasoning_parsers=[ReasoningParserSpec("a", "nope_xyz:A")]))
    with pytest.raises(PluginError, match="from plugin 'p1': cannot import 'nope_xyz:A'"):
        pm.registry.resolve("reasoning_parser", "a")


def test_duplicate_name_names_both() -> None:
    a = plugin("alpha", register_tool_parsers=[ToolParserSpec("hermes", "m:A")])
    b = plugin("beta", register_tool_parsers=[ToolParserSpec("hermes", "m:B")])
    with pytest.raises(PluginError, match="tool_parser 'hermes' is provided twice.*alpha.*beta"):
        load(a, b)


def test_duplicate_architecture_names_both() -> None:
    a = plugin(
        "alpha",
        register_model_architectures=[ModelArchitectureSpec("q", "m:A", architectures=("X",))],
    )
    b = plugin(
        "beta",
        register_model_architectures=[ModelArchitectureSpec("r", "m:B", architectures=("X",))],
    )
    with pytest.raises(PluginError, match="HF architecture 'X' is served twice.*alpha.*beta"):
        load(a, b)


def test_wrong_return_type_fails_plugin_not_engine() -> None:
    bad = plugin("bad", register_tool_parsers=[ReasoningParserSpec("x", "m:A")])
    good = plugin("good", register_tool_parsers=[ToolParserSpec("y", "m:A")])
    pm = load(bad, good)
    info = {p.name: p for p in pm.plugins}
    assert info["bad"].status == "failed"
    assert "must be an engine_sdk.ToolParserSpec" in (info["bad"].error or "")
    assert info["good"].status == "loaded"
    assert pm.registry.names("tool_parser") == ["y"]


def test_failing_hook_of_requested_plugin_is_fatal() -> None:
    class Broken:
        __name__ = "broken"

        @hookimpl
        def register_tool_parsers(self) -> list[ToolParserSpec]:
            raise RuntimeError("boom")

    with pytest.raises(PluginError, match="'broken'.*requested but cannot load.*boom"):
        load(Broken(), requested=["broken"])
    pm = load(Broken())
    assert pm.plugins[0].status == "failed" and "boom" in (pm.plugins[0].error or "")


def test_requested_missing_gives_install_hint() -> None:
    catalogue = Catalogue(
        [CatalogueEntry("awq", "engine-awq", "engine_awq.plugin", "planned")], source=None
    )
    with pytest.raises(PluginError, match="'awq' was requested.*pip install engine-awq"):
        PluginManager.load(requested=["awq"], env={}, discover=False, catalogue=catalogue)
    with pytest.raises(PluginError, match="'does-not-exist'.*pip install engine-does-not-exist"):
        PluginManager.load(requested=["does-not-exist"], env={}, discover=False)
    with pytest.raises(PluginError, match="'viaenv' was requested"):
        PluginManager.load(env={"ENGINE_PLUGINS": "viaenv"}, discover=False)


def test_first_party_hint_is_a_path() -> None:
    catalogue = Catalogue.from_file(Path(__file__).resolve().parents[2] / "registry.toml")
    entry = catalogue.get("reference")
    assert entry is not None and entry.path is not None
    assert catalogue.install_hint("reference") == f"install it with: pip install -e {entry.path}"


def test_activation_parsing() -> None:
    act = parse_activation(["a", "no:b", "a"], {"ENGINE_PLUGINS": " c , no:d ,,"})
    assert act.requested == ("a", "c")
    assert act.blocked == {"b", "d"}
    assert act.autoload and not act.trace
    assert act.as_args() == ["a", "c", "no:b", "no:d"]
    off = parse_activation([], {"ENGINE_PLUGINS_AUTOLOAD": "0", "ENGINE_TRACE_PLUGINS": "1"})
    assert not off.autoload and off.trace
    with pytest.raises(PluginError, match="both requested and blocked"):
        parse_activation(["x"], {"ENGINE_PLUGINS": "no:x"})
    with pytest.raises(PluginError, match="ENGINE_PLUGINS_AUTOLOAD='maybe'"):
        parse_activation([], {"ENGINE_PLUGINS_AUTOLOAD": "maybe"})
    with pytest.raises(PluginError, match="write no:NAME"):
        parse_activation(["no:"], {})


def test_select_attention_backend(targets: str) -> None:
    p = plugin(
        "att",
        register_attention_backends=[
            AttentionBackendSpec("cpu_ref", f"{targets}:CpuBackend", devices=("cpu", "cuda")),
            AttentionBackendSpec(
                "fast",
                f"{targets}:FastBackend",
                devices=("cuda",),
                dtypes=("float16", "bfloat16"),
                priority=10,
            ),
        ],
    )
    pm = load(p)

    def pick(device: str, dtype: str, block_size: int, name: str | None = None) -> str:
        needs = AttentionNeeds(device, dtype, block_size)
        return pm.select_attention_backend(needs, name).__name__

    assert pick("cuda:0", "torch.float16", 16) == "FastBackend"
    assert pick("cuda", "float32", 16) == "CpuBackend"
    assert pick("cpu", "bfloat16", 32) == "CpuBackend"
    assert pick("cuda", "float16", 16, "cpu_ref") == "CpuBackend"
    with pytest.raises(PluginError, match="(?s)'fast' cannot run device=cpu.*not in \\['cuda'\\]"):
        pick("cpu", "float16", 16, "fast")
    with pytest.raises(PluginError, match="(?s)no attention backend fits.*cpu_ref: block size 7"):
        pick("cpu", "float32", 7)


def test_require_quant_method_hint() -> None:
    catalogue = Catalogue(
        [
            CatalogueEntry(
                "awq",
                "engine-awq",
                "engine_awq.plugin",
                "planned",
                {"quantization_method": ["awq"]},
            )
        ]
    )
    pm = load(catalogue=catalogue)
    with pytest.raises(PluginError, match="'awq' is not provided.*pip install engine-awq"):
        pm.require_quant_method("awq")
    with pytest.raises(PluginError, match="'gptq'.*no known plugin provides it"):
        pm.require_quant_method("gptq")


def test_require_quant_method_resolves(targets: str) -> None:
    p = plugin(
        "q", register_quantization_methods=[QuantizationMethodSpec("myq", f"{targets}:NotAParser")]
    )
    pm = load(p)
    with pytest.raises(PluginError, match="does not subclass .*QuantizationConfig"):
        pm.require_quant_method("myq")


def test_find_model_architecture_missing() -> None:
    a = plugin(
        "alpha",
        register_model_architectures=[ModelArchitectureSpec("q", "m:A", architectures=("Q3",))],
    )
    pm = load(a)
    with pytest.raises(PluginError, match="'LlamaForCausalLM'.*installed architectures: Q3"):
        pm.find_model_architecture("LlamaForCausalLM")


def test_missing_architecture_names_the_catalogue_plugins_for_it() -> None:
    """One line: the installed architectures and registry.toml's plugins for the missing one."""
    a = plugin(
        "alpha",
        register_model_architectures=[ModelArchitectureSpec("q", "m:A", architectures=("Q3",))],
    )
    entry = CatalogueEntry(
        "moe",
        "engine-moe",
        "engine_moe.plugin",
        "experimental",
        {"model_architecture": ["mixtral"]},
        architectures=("MixtralForCausalLM",),
    )
    pm = load(a, catalogue=Catalogue([entry]))
    with pytest.raises(PluginError) as info:
        pm.find_model_architecture("MixtralForCausalLM")
    message = str(info.value)
    assert "\n" not in message
    assert "installed architectures: Q3" in message
    assert "registry.toml lists it in: moe (pip install engine-moe)" in message
    with pytest.raises(PluginError, match="registry.toml knows no plugin for it"):
        pm.find_model_architecture("FooForCausalLM")


def test_real_catalogue_names_the_gemma_plugin() -> None:
    """With the checkout's registry.toml and only engine-qwen3 loaded, Gemma 3 points at
    engine-gemma's install command."""
    import engine_qwen3.plugin

    pm = PluginManager.load(extra_plugins=[engine_qwen3.plugin], discover=False, env={})
    with pytest.raises(PluginError) as info:
        pm.find_model_architecture("Gemma3ForCausalLM")
    message = str(info.value)
    assert "installed architectures: Qwen3ForCausalLM;" in message
    assert "gemma (pip install -e " in message and "plugins/gemma)" in message


def test_worker_args_and_plugin_objects() -> None:
    class Empty:  # an object with no hooks registers fine
        __name__ = "ns"

    pm = load(Empty())
    assert pm.get_plugin("ns") is not None and pm.get_plugin("ns").status == "loaded"  # type: ignore[union-attr]
    assert pm.worker_args() == []  # extras are not entry points: workers get them the same way
