"""The decode kernels of LoRA and the GEMV build for an sm90 target (H100/H200) from a CPU
machine: Triton's whole compile, ptxas included (``engine_sdk.testing.gpu_compile``), which
the interpreter tests never run. Shapes of the Qwen3-0.6B decode step at batch 1."""

from __future__ import annotations

import pytest
from engine_sdk.testing.gpu_compile import compile_for_gpu

_LORA_TYPES = {"lp_ptr": "*fp32", "slots_ptr": "*i32", "starts_ptr": "*i32", "eps": "fp32"}


@pytest.mark.parametrize(
    "kernel,block_k,slices,parts,shrink",
    [
        ("gemv_kernel", 2048, 1, 16, False),  # o_proj: 16 parts of K 2048
        ("gemv_kernel", 2048, 1, 1, False),  # (one part)
        ("gemv_add_rms_norm_kernel", 1024, 3, 8, False),  # q/k/v after the fused norm
        ("gemv_kernel", 2048, 1, 4, True),  # o_proj, the shrink inside the launch
        ("gemv_add_rms_norm_kernel", 1024, 3, 2, True),  # q/k/v, the same
    ],
)
def test_gemv_with_the_lora_epilogue(
    kernel: str, block_k: int, slices: int, parts: int, shrink: bool
) -> None:
    constants = {
        "HAS_BIAS": False, "BLOCK_M": 1, "BLOCK_N": 2, "BLOCK_K": block_k, "LORA": True,
        "NUM_SLICES": slices, "BLOCK_R": 16, "BLOCK_P": parts, "SHRINK": shrink,
        "SHRINK_K": 256,
    }  # fmt: skip
    types = {**_LORA_TYPES, "flag_ptr": "*i32"}
    report = compile_for_gpu("engine_sdk.layers._gemv_kernels", kernel, constants, types)
    assert report["cubin_bytes"] > 0
    # the shrink programs announce (release) and the GEMV programs wait (an acquire load)
    ptx = report["ptx"]
    assert ("gpu.release.add" in ptx and "ld.global.gpu.acquire" in ptx) == shrink


def test_gate_up_with_the_expand_deferred() -> None:
    """``ENGINE_LORA_EXPAND_IN_ACT``: the gate/up norm GEMV whose first programs write the
    shrink and signal nothing (no release, no acquire, no epilogue), and the activation's
    kernel that adds the gate/up expand."""
    constants = {
        "HAS_BIAS": False, "BLOCK_M": 1, "BLOCK_N": 2, "BLOCK_K": 1024, "LORA": False,
        "NUM_SLICES": 2, "BLOCK_R": 16, "BLOCK_P": 2, "SHRINK": True, "SHRINK_K": 256,
    }  # fmt: skip
    types = {**_LORA_TYPES, "flag_ptr": "*i32"}
    gemv = compile_for_gpu(
        "engine_sdk.layers._gemv_kernels", "gemv_add_rms_norm_kernel", constants, types
    )
    assert gemv["cubin_bytes"] > 0
    assert "gpu.release" not in gemv["ptx"] and "acquire" not in gemv["ptx"]
    silu = compile_for_gpu(
        "engine_sdk.layers._lora_kernels", "silu_mul_lora_shrink_kernel",
        {"BLOCK_R": 16, "BLOCK_K": 256, "GU_EXPAND": True, "BLOCK_GP": 2},
        {"parts_ptr": "*fp32", "slots_ptr": "*i32", "gp_ptr": "*fp32"},
    )  # fmt: skip
    assert silu["cubin_bytes"] > 0


def test_lora_shrink_and_expand_kernels() -> None:
    module = "engine_sdk.layers._lora_kernels"
    fp32_parts = {"parts_ptr": "*fp32", "h_ptr": "*fp32", "slots_ptr": "*i32", "eps": "fp32"}
    shrink = compile_for_gpu(
        module, "lora_shrink_add_rms_norm_kernel",
        {"BLOCK_R": 16, "BLOCK_K": 128, "ROW_P": 1024}, fp32_parts,
    )  # fmt: skip
    blocked = compile_for_gpu(
        module, "lora_expand_blocked_kernel",
        {"NUM_SLOTS": 4, "NUM_SLICES": 3, "BLOCK_M": 16, "BLOCK_N": 128, "BLOCK_R": 16,
         "DOT_PRECISION": "tf32", "BLOCK_P": 8},
        {**fp32_parts, "starts_ptr": "*i32"},
    )  # fmt: skip
    blocked_shrink = compile_for_gpu(
        module, "lora_shrink_blocked_kernel",
        {"NUM_SLOTS": 4, "BLOCK_M": 16, "BLOCK_R": 64, "BLOCK_K": 64, "DOT_PRECISION": "tf32"},
        fp32_parts,
    )  # fmt: skip
    silu = compile_for_gpu(
        module, "silu_mul_lora_shrink_kernel", {"BLOCK_R": 16, "BLOCK_K": 256}, fp32_parts
    )
    sizes = (shrink, blocked, blocked_shrink, silu)
    assert min(report["cubin_bytes"] for report in sizes) > 0


@pytest.mark.parametrize(
    "store,cache", [(False, "*bf16"), (True, "*bf16"), (True, "*fp8e4nv")], ids=str
)
def test_qkv_norm_rope_with_the_kv_store(store: bool, cache: str) -> None:
    """The q/k/v epilogue, writing k and v into the paged cache (bf16 or fp8) or not."""
    constants = {
        "HEAD_DIM": 128, "HALF_P": 64, "HEADS_P": 16, "HAS_NORM": True, "STORE": store,
        "FP8": cache == "*fp8e4nv",
    }  # fmt: skip
    types = {
        "k_cache_ptr": cache, "v_cache_ptr": cache, "slot_ptr": "*i64",
        "kv_scales_ptr": "*fp32", "eps": "fp64",
    }  # fmt: skip
    report = compile_for_gpu(
        "engine_sdk.layers._fused_kernels", "qkv_norm_rope_kernel", constants, types
    )
    assert report["cubin_bytes"] > 0
    # the fp8 store divides exactly (div.rn), as the backend's store kernel does
    assert ("div.rn.f32" in report["ptx"]) == (cache == "*fp8e4nv")


@pytest.mark.parametrize("masked", [False, True])
def test_row_sampler_kernel(masked: bool) -> None:
    """The decode graph's sampling launch (``engine_sdk.layers.sampling``), and the
    sampler's masked one (structured outputs: packed allowed-token bits per row)."""
    types = {
        "logits_ptr": "*fp32", "temps_ptr": "*fp32", "step_ptr": "*i64",
        "part_val_ptr": "*fp32", "part_idx_ptr": "*i32", "lock_ptr": "*i32", "out_ptr": "*i64",
        "bits_ptr": "*u8" if masked else "*i32",
    }  # fmt: skip
    report = compile_for_gpu(
        "engine_sdk.layers._sampling_kernels", "sample_rows_kernel",
        {"BLOCK": 4096, "CHUNKS_P": 64, "MASKED": masked}, types,
    )  # fmt: skip
    assert report["cubin_bytes"] > 0 and "atom.global" in report["ptx"]
