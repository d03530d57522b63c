"""Choosing an attention backend that declares the requested ``--kv-cache-dtype``."""

from __future__ import annotations

from dataclasses import dataclass, field

import pytest
import torch
from engine.errors import StartupError
from engine.model_executor.kv_cache_dtype import (
    resolve_kv_cache_dtype,
    select_backend_for_kv_cache_dtype,
    spec_stores,
)
from engine_sdk.specs import AttentionBackendSpec


@dataclass
class _Registry:
    specs_: list[AttentionBackendSpec] = field(default_factory=list)

    def specs(self, kind: str) -> list[AttentionBackendSpec]:
        assert kind == "attention_backend"
        return self.specs_


@dataclass
class _PM:
    registry: _Registry


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


PM = _PM(
    _Registry(
        [
            _spec("fast", ("auto",), 10),
            _spec("quant", ("auto", "fp8"), 5),
            _spec("e5", ("auto", "fp8_e5m2"), 1),
            _spec("gpu_only", ("auto", "fp8_e5m2"), 20, devices=("cuda",)),
        ]
    )
)


def test_auto_leaves_the_choice_to_the_plugin_manager() -> None:
    assert select_backend_for_kv_cache_dtype(PM, "cpu", "float32", 16, None, "auto") is None
    assert select_backend_for_kv_cache_dtype(PM, "cpu", "float32", 16, "fast", "auto") == "fast"


def test_fp8_picks_the_best_fitting_backend_that_stores_it() -> None:
    assert select_backend_for_kv_cache_dtype(PM, "cpu", "float32", 16, None, "fp8") == "quant"
    # fp8 and fp8_e4m3 are one dtype.
    assert select_backend_for_kv_cache_dtype(PM, "cpu", "float32", 16, None, "fp8_e4m3") == "quant"
    # gpu_only stores e5m2 with a higher priority but does not fit the CPU.
    assert select_backend_for_kv_cache_dtype(PM, "cpu", "float32", 16, None, "fp8_e5m2") == "e5"
    assert select_backend_for_kv_cache_dtype(PM, "cuda:0", "float32", 16, None, "fp8_e5m2") == (
        "gpu_only"
    )


def test_named_backend_without_fp8_is_a_startup_error() -> None:
    with pytest.raises(StartupError) as info:
        select_backend_for_kv_cache_dtype(PM, "cpu", "float32", 16, "fast", "fp8")
    msg = str(info.value)
    assert "'fast' cannot store --kv-cache-dtype fp8" in msg
    assert "backends that store it: quant" in msg and "--attention-backend" in msg


def test_no_fitting_backend_stores_it() -> None:
    pm = _PM(_Registry([_spec("fast", ("auto",), 10)]))
    with pytest.raises(StartupError, match=r"stores --kv-cache-dtype fp8 .*no loaded backend"):
        select_backend_for_kv_cache_dtype(pm, "cpu", "float32", 16, None, "fp8")


def test_spec_stores_and_resolve() -> None:
    assert spec_stores(_spec("a", ("auto", "fp8_e4m3"), 0), "fp8")
    assert not spec_stores(_spec("a", ("auto", "fp8"), 0), "fp8_e5m2")
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
    assert all(spec_stores(s, "fp8") for s in specs)
    pm = _PM(_Registry(specs))
    assert select_backend_for_kv_cache_dtype(PM, "cpu", "float32", 16, None, "fp8") == "quant"
    assert select_backend_for_kv_cache_dtype(pm, "cuda", "bfloat16", 16, None, "fp8") == "triton"
    with pytest.raises(StartupError, match="'triton' cannot store --kv-cache-dtype fp8_e5m2"):
        select_backend_for_kv_cache_dtype(pm, "cuda", "bfloat16", 16, "triton", "fp8_e5m2")
