"""Choosing an attention backend that declares the requested ``--kv-cache-dtype``.

The cache dtype is one capability among the others (``engine.plugins.capabilities``); the
plugin manager's selection is the only place a backend is chosen.
"""

from __future__ import annotations

from types import ModuleType

import pytest
import torch
from engine.errors import StartupError
from engine.model_executor.kv_cache_dtype import resolve_kv_cache_dtype
from engine.plugins import PluginError, PluginManager
from engine.plugins.capabilities import AttentionNeeds, stores_kv_cache_dtype
from engine.plugins.selection import rank_backends
from engine_sdk import hookimpl
from engine_sdk.specs import AttentionBackendSpec


def _spec(
    name: str, kv: tuple[str, ...], priority: int, devices: tuple[str, ...] = ("cpu", "cuda")
) -> AttentionBackendSpec:
    return AttentionBackendSpec(
        name=name,
        target=f"pkg.{name}:Backend",
        devices=devices,
        block_sizes=(16,),
        kv_cache_dtypes=kv,
        priority=priority,
    )


SPECS = [
    _spec("fast", ("auto",), 10),
    _spec("quant", ("auto", "fp8"), 5),
    _spec("e5", ("auto", "fp8_e5m2"), 1),
    _spec("gpu_only", ("auto", "fp8_e5m2"), 20, devices=("cuda",)),
]


def _choice(specs: list[AttentionBackendSpec], device: str, kv_cache_dtype: str) -> str | None:
    fitting, _ = rank_backends(specs, AttentionNeeds(device, "float32", 16, kv_cache_dtype))
    return fitting[0].name if fitting else None


def _manager(specs: list[AttentionBackendSpec]) -> PluginManager:
    plugin = ModuleType("kv_backends")

    @hookimpl
    def register_attention_backends() -> list[AttentionBackendSpec]:
        return specs

    plugin.register_attention_backends = register_attention_backends  # type: ignore[attr-defined]
    return PluginManager.load(extra_plugins=[plugin], discover=False, env={})


def test_auto_takes_the_highest_priority_backend() -> None:
    assert _choice(SPECS, "cpu", "auto") == "fast"


def test_fp8_picks_the_best_fitting_backend_that_stores_it() -> None:
    assert _choice(SPECS, "cpu", "fp8") == "quant"
    # fp8 and fp8_e4m3 are one dtype.
    assert _choice(SPECS, "cpu", "fp8_e4m3") == "quant"
    # gpu_only stores e5m2 with a higher priority but does not fit the CPU.
    assert _choice(SPECS, "cpu", "fp8_e5m2") == "e5"
    assert _choice(SPECS, "cuda:0", "fp8_e5m2") == "gpu_only"


def test_named_backend_without_fp8_is_refused_with_its_reasons() -> None:
    needs = AttentionNeeds("cpu", "float32", 16, "fp8")
    with pytest.raises(PluginError) as info:
        _manager(SPECS).select_attention_backend(needs, "fast")
    msg = str(info.value)
    assert "'fast' cannot run device=cpu, dtype=float32, block_size=16, kv_cache_dtype=fp8" in msg
    assert "fast: kv_cache_dtype 'fp8' not in ['auto']" in msg
    assert "Backends that fit: quant" in msg and "--attention-backend" in msg


def test_no_fitting_backend_stores_it() -> None:
    needs = AttentionNeeds("cpu", "float32", 16, "fp8")
    with pytest.raises(PluginError, match=r"no attention backend fits .*kv_cache_dtype=fp8"):
        _manager([_spec("fast", ("auto",), 10)]).select_attention_backend(needs)


def test_stores_and_resolve() -> None:
    assert stores_kv_cache_dtype(_spec("a", ("auto", "fp8_e4m3"), 0), "fp8")
    assert not stores_kv_cache_dtype(_spec("a", ("auto", "fp8"), 0), "fp8_e5m2")
    assert resolve_kv_cache_dtype("auto", torch.bfloat16) == torch.bfloat16
    assert resolve_kv_cache_dtype("fp8", torch.bfloat16) == torch.float8_e4m3fn
    assert resolve_kv_cache_dtype("fp8_e5m2", torch.float32) == torch.float8_e5m2
    with pytest.raises(StartupError, match="valid values: auto, fp8, fp8_e4m3, fp8_e5m2"):
        resolve_kv_cache_dtype("int8", torch.float32)


def test_first_party_backends_declare_fp8() -> None:
    import engine_reference.plugin
    import engine_triton.plugin

    specs = [
        *engine_reference.plugin.register_attention_backends(),
        *engine_triton.plugin.register_attention_backends(),
    ]
    assert all(stores_kv_cache_dtype(s, "fp8") for s in specs)
    fitting, _ = rank_backends(specs, AttentionNeeds("cuda", "bfloat16", 16, "fp8"))
    assert fitting[0].name == "triton"
    needs = AttentionNeeds("cuda", "bfloat16", 16, "fp8_e5m2")
    with pytest.raises(PluginError, match="triton: kv_cache_dtype 'fp8_e5m2' not in"):
        _manager(specs).select_attention_backend(needs, "triton")
