"""The reference backend against the SDK attention conformance suite (CPU)."""

from __future__ import annotations

import dataclasses

import pytest
import torch
from engine_reference.backend import ReferenceAttentionBackend
from engine_sdk.testing.attention import (
    ATTENTION_CASES,
    FP8_ATTENTION_CASES,
    MODEL_FEATURE_ATTENTION_CASES,
    AttentionCase,
    SeqSpec,
    dense_causal_attention,
    run_attention_case,
    run_feature_case,
)


@pytest.mark.parametrize("case", ATTENTION_CASES, ids=lambda c: c.name)
def test_conformance_float32(case: AttentionCase) -> None:
    run_attention_case(ReferenceAttentionBackend, case, dtype=torch.float32)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
@pytest.mark.parametrize("case", MODEL_FEATURE_ATTENTION_CASES, ids=lambda c: c.name)
def test_model_feature_cases_are_computed(case: AttentionCase, dtype: torch.dtype) -> None:
    assert run_feature_case(ReferenceAttentionBackend, case, dtype=dtype) is None  # no refusal


def test_soft_cap_changes_the_output() -> None:
    """The soft-cap case really depends on the cap: without it the reference mismatches."""
    case = MODEL_FEATURE_ATTENTION_CASES[0]
    assert case.logits_soft_cap is not None

    class Uncapped(ReferenceAttentionBackend):
        def __init__(self, config):  # type: ignore[no-untyped-def]
            super().__init__(dataclasses.replace(config, logits_soft_cap=None))

    with pytest.raises(AssertionError, match="max abs error"):
        run_attention_case(Uncapped, case)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_conformance_half_precision(dtype: torch.dtype) -> None:
    for case in ATTENTION_CASES[:6]:
        run_attention_case(ReferenceAttentionBackend, case, dtype=dtype)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
@pytest.mark.parametrize("case", FP8_ATTENTION_CASES, ids=lambda c: c.name)
def test_conformance_fp8_kv_cache(case: AttentionCase, dtype: torch.dtype) -> None:
    run_attention_case(ReferenceAttentionBackend, case, dtype=dtype)


@pytest.mark.parametrize("case", FP8_ATTENTION_CASES[:2], ids=lambda c: c.name)
def test_conformance_fp8_e5m2_kv_cache(case: AttentionCase) -> None:
    run_attention_case(
        ReferenceAttentionBackend, dataclasses.replace(case, kv_cache_dtype="fp8_e5m2")
    )


def test_fp8_cache_stores_one_byte_quantized_values() -> None:
    """The cache holds fp8(x / k_scale); the output stays close to unquantized attention."""
    from engine_sdk.interfaces.attention import AttentionBatch, AttentionLayerConfig

    gen = torch.Generator().manual_seed(3)
    num_tokens, heads, head_dim, block_size = 12, 2, 16, 4
    config = AttentionLayerConfig(heads, heads, head_dim, head_dim**-0.5, block_size, torch.float32)
    backend = ReferenceAttentionBackend(dataclasses.replace(config, kv_cache_dtype="fp8"))
    backend.set_kv_scales(0.01, 0.02)
    q, k, v = (torch.randn(num_tokens, heads, head_dim, generator=gen) for _ in range(3))
    cache = torch.zeros(2, 3, block_size, heads, head_dim, dtype=torch.float8_e4m3fn)
    batch = AttentionBatch(
        query_start_loc=torch.tensor([0, num_tokens], dtype=torch.int32),
        seq_lens=torch.tensor([num_tokens], dtype=torch.int32),
        block_tables=torch.tensor([[2, 0, 1]], dtype=torch.int32),
        slot_mapping=torch.tensor([2 * 4 + i for i in range(4)] + list(range(8))),
        max_query_len=num_tokens,
        max_seq_len=num_tokens,
        num_seqs=1,
        num_tokens=num_tokens,
        query_start_loc_cpu=[0, num_tokens],
        seq_lens_cpu=[num_tokens],
    )
    out = backend.forward(q, k, v, cache, batch)
    assert cache.dtype == torch.float8_e4m3fn and cache.element_size() == 1
    stored_k = torch.cat([cache[0, 2], cache[0, 0], cache[0, 1]])
    assert torch.equal(
        stored_k.view(torch.uint8), (k / 0.01).to(torch.float8_e4m3fn).view(torch.uint8)
    )
    exact = dense_causal_attention(q, k, v, head_dim**-0.5).reshape(num_tokens, -1)
    # e4m3 keeps 3 mantissa bits: each stored value is within 2^-4 (relative) of the real
    # one, so the output (a convex mix of V rows, with slightly moved weights) stays within
    # about that fraction of max |v|; the first row, attending only to itself, reaches it.
    err = (out.double() - exact).abs().max().item()
    assert err < 0.08 * v.abs().max().item()
    assert err > 0  # it did quantize


def test_suite_catches_a_backend_that_ignores_kv_scales() -> None:
    class Unscaled(ReferenceAttentionBackend):
        def set_kv_scales(self, k_scale=None, v_scale=None):  # type: ignore[no-untyped-def]
            pass

    with pytest.raises(AssertionError, match="max abs error"):
        run_attention_case(Unscaled, FP8_ATTENTION_CASES[0])


def test_auto_kv_cache_is_unchanged_by_kv_scales() -> None:
    """Scales only apply to an fp8 cache: a model-dtype cache ignores them."""

    class Scaled(ReferenceAttentionBackend):
        def __init__(self, config):  # type: ignore[no-untyped-def]
            super().__init__(config)
            self.set_kv_scales(0.5, 4.0)

    run_attention_case(Scaled, ATTENTION_CASES[4])


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("case", ATTENTION_CASES, ids=lambda c: c.name)
def test_conformance_cuda(case: AttentionCase) -> None:
    run_attention_case(ReferenceAttentionBackend, case, device="cuda", dtype=torch.bfloat16)


def test_suite_catches_a_slightly_wrong_backend() -> None:
    class Scaled(ReferenceAttentionBackend):
        def forward(self, query, key, value, kv_cache, metadata):  # type: ignore[no-untyped-def]
            return super().forward(query, key, value, kv_cache, metadata) * 1.01

    with pytest.raises(AssertionError, match="max abs error"):
        run_attention_case(Scaled, AttentionCase("decode", (SeqSpec((8, 1)),)))


def test_suite_catches_a_backend_that_does_not_write_the_cache() -> None:
    class NoWrite(ReferenceAttentionBackend):
        def _write_cache(self, key, value, kv_cache, slot_mapping):  # type: ignore[no-untyped-def]
            pass

    with pytest.raises(AssertionError, match="max abs error"):
        run_attention_case(NoWrite, AttentionCase("prefill", (SeqSpec((8,)),)))


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("case", FP8_ATTENTION_CASES, ids=lambda c: c.name)
def test_conformance_fp8_cuda(case: AttentionCase) -> None:
    run_attention_case(ReferenceAttentionBackend, case, device="cuda", dtype=torch.bfloat16)


def test_plugin_conforms() -> None:
    import engine_reference.plugin
    from engine_sdk.testing import assert_plugin_conforms

    assert_plugin_conforms(engine_reference.plugin)


def test_spec_declares_fp8_kv_cache() -> None:
    import engine_reference.plugin

    (spec,) = engine_reference.plugin.register_attention_backends()
    assert set(spec.kv_cache_dtypes) == {"auto", "fp8", "fp8_e4m3", "fp8_e5m2"}
