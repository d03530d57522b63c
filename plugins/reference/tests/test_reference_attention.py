"""The reference backend against the SDK attention conformance suite (CPU)."""

from __future__ import annotations

import pytest
import torch
from engine_reference.backend import ReferenceAttentionBackend
from engine_sdk.testing.attention import (
    ATTENTION_CASES,
    AttentionCase,
    SeqSpec,
    run_attention_case,
)


@pytest.mark.parametrize("case", ATTENTION_CASES, ids=lambda c: c.name)
def test_conformance_float32(case: AttentionCase) -> None:
    run_attention_case(ReferenceAttentionBackend, case, dtype=torch.float32)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_conformance_half_precision(dtype: torch.dtype) -> None:
    for case in ATTENTION_CASES[:6]:
        run_attention_case(ReferenceAttentionBackend, case, dtype=dtype)


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


def test_plugin_conforms() -> None:
    import engine_reference.plugin
    from engine_sdk.testing import assert_plugin_conforms

    assert_plugin_conforms(engine_reference.plugin)
