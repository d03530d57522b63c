"""The one decision site: declared capabilities checked against a run's needs, with every
reason listed, for attention backends and quantization methods."""

from __future__ import annotations

from types import SimpleNamespace

import torch
from engine.config import EngineArgs
from engine.model_executor.plugin_needs import attention_needs
from engine.plugins.capabilities import (
    AttentionNeeds,
    QuantizationNeeds,
    attention_refusals,
    quantization_refusals,
)
from engine_sdk import AttentionBackendSpec, QuantizationMethodSpec

GPU = AttentionBackendSpec(
    "gpu",
    "pkg.gpu:Backend",
    devices=("cuda",),
    min_capability=80,
    dtypes=("float16", "bfloat16"),
    block_sizes=(16,),
    kv_cache_dtypes=("auto", "fp8"),
    head_sizes=(64, 128),
    supports_sliding_window=False,
)


def test_a_fitting_run_has_no_reasons() -> None:
    needs = AttentionNeeds("cuda:0", "torch.bfloat16", 16, "fp8_e4m3", capability=90, head_size=64)
    assert attention_refusals(GPU, needs) == []


def test_every_reason_is_listed() -> None:
    needs = AttentionNeeds(
        "cuda",
        "float32",
        32,
        "fp8_e5m2",
        capability=75,
        head_size=80,
        sliding_window=True,
        logits_soft_cap=True,
    )
    assert attention_refusals(GPU, needs) == [
        "needs compute capability >= 8.0, this GPU is 7.5",
        "dtype 'float32' not in ['float16', 'bfloat16']",
        "kv_cache_dtype 'fp8_e5m2' not in ['auto', 'fp8']",
        "block size 32 not in [16]",
        "head size 80 not in [64, 128]",
        "the model uses a sliding window, which it does not support",
        "the model soft-caps attention logits, which it does not support",
    ]
    assert attention_refusals(GPU, AttentionNeeds("cpu", "float16", 16))[0] == (
        "device 'cpu' not in ['cuda']"
    )


def test_needs_come_from_the_flags_and_the_model() -> None:
    config = SimpleNamespace(
        hidden_size=256, num_attention_heads=4, sliding_window=4096, attn_logit_softcapping=50.0
    )
    args = EngineArgs(model="unused", kv_cache_dtype="fp8")
    needs = attention_needs(args, torch.device("cpu"), torch.float32, 16, config)
    assert needs == AttentionNeeds(
        "cpu", "float32", 16, "fp8", None, head_size=64, sliding_window=True, logits_soft_cap=True
    )
    plain = attention_needs(args, torch.device("cpu"), torch.float32, 16, SimpleNamespace())
    assert (plain.head_size, plain.sliding_window, plain.logits_soft_cap) == (None, False, False)


AWQ = QuantizationMethodSpec(
    "awq", "pkg.awq:Config", devices=("cuda",), min_capability=75, reference_devices=("cpu",)
)


def test_quantization_devices_and_capability_are_the_core_s_check() -> None:
    assert quantization_refusals(AWQ, QuantizationNeeds("cpu")) == []
    assert quantization_refusals(AWQ, QuantizationNeeds("cuda:1", 80)) == []
    assert quantization_refusals(AWQ, QuantizationNeeds("cuda", 70)) == [
        "needs compute capability >= 7.5, this GPU is 7.0 (the reference path runs on: cpu)"
    ]
    assert quantization_refusals(AWQ, QuantizationNeeds("cuda", 70, allow_reference=True)) == []
    assert quantization_refusals(AWQ, QuantizationNeeds("mps")) == [
        "device 'mps' not in ['cuda', 'cpu']"
    ]
