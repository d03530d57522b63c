"""The fp8 plugin's Triton kernels build for an sm90 target (H100/H200) from a CPU machine:
Triton's whole compile, ptxas included (``engine_sdk.testing.gpu_compile``), which the
interpreter tests never run. Constants are the ones the launches pick: the measured H100
tiles (``engine_fp8/tuned``) for Qwen3-0.6B (hidden 1024, intermediate 3072, q/k/v 4096
columns) and Llama-3.1-8B (hidden 4096, intermediate 14336), and the default tiles;
bf16 activations, float8 e4m3 weights, float32 scales. Float scalars are compiled as
float32 (a launch's Python float) and as float64 (as torch.compile may pass them)."""

from __future__ import annotations

from typing import Any

import pytest
from engine_sdk.testing.gpu_compile import compile_for_gpu


def _compile(module: str, kernel: str, constants: dict[str, Any], **kw: Any) -> dict[str, Any]:
    """Compile (left-out constexprs take their defaults, as in a launch); it must build."""
    report = compile_for_gpu(module, kernel, constants, **kw)
    assert report["cubin_bytes"] > 0
    return report


# -- the split-K decode GEMV (engine_fp8.gemv), with and without the add+RMSNorm prologue ----

_CHANNEL = {"SCALE": 1, "SCALE_ROWS": 1, "SCALE_COLS": 1}
_TENSOR = {"SCALE": 0, "SCALE_ROWS": 1, "SCALE_COLS": 1}
_BLOCK_128 = {"SCALE": 2, "SCALE_ROWS": 128, "SCALE_COLS": 128}  # block scales 128 x 128


def _gemv(
    tile: tuple[str, int, int, int, int],
    scale: dict[str, int],
    split: bool,
    bias: bool = False,
    norm_m: int = 0,
    eps: str = "fp32",
) -> tuple[dict[str, Any], bool, bool, str]:
    """(constants, SPLIT, HAS_BIAS, eps type) of a launch: ``tile`` (variant, BLOCK_M,
    BLOCK_N, BLOCK_K, NUM_STAGES); ``norm_m`` > 0: the add+RMSNorm prologue for that many
    rows of K 1024 (``split_k.norm_launch_args``: NORM_BLOCK min(K, 4096 / NORM_M))."""
    variant, m, n, k, stages = tile
    norm = {"NORM": norm_m > 0, "NORM_M": max(norm_m, 1), "NORM_BLOCK": 1024 if norm_m else 16}
    constants = {
        **scale, **norm, "USE_DOT": variant == "dot", "BLOCK_M": m, "BLOCK_N": n, "BLOCK_K": k,
        "NUM_STAGES": stages, "SPLIT": split, "HAS_BIAS": bias,
    }  # fmt: skip
    return constants, split, bias, eps


GEMV_CASES = {
    # tuned fp8,1024,2048,1 (0.6B o_proj, one token): 2 rows x 2048, no split
    "o_proj-0.6B": _gemv(("fma", 1, 2, 2048, 1), _CHANNEL, split=False),
    # tuned fp8_norm,4096,1024,1 (0.6B q/k/v after the norm): split 2, the prologue
    "qkv-norm-0.6B": _gemv(("fma", 1, 32, 256, 4), _CHANNEL, split=True, norm_m=1),
    "qkv-norm-0.6B-eps-fp64": _gemv(
        ("fma", 1, 32, 256, 4), _CHANNEL, split=True, norm_m=1, eps="fp64"
    ),
    # tuned fp8,4096,14336,1 (8B down): split 3; a per-tensor scale
    "down-8B-tensor": _gemv(("fma", 1, 32, 256, 4), _TENSOR, split=True),
    # the default one-token tile (64 x 128) with block scales, a bias
    "block-fma-bias": _gemv(("fma", 1, 64, 128, 4), _BLOCK_128, split=True, bias=True),
    # 2..16 tokens: the dot variant (64 x 128, 16 token rows)
    "dot-bias": _gemv(("dot", 16, 64, 128, 4), _CHANNEL, split=True, bias=True),
    # the dot variant with block scales and the prologue for 4 rows
    "dot-block-norm": _gemv(("dot", 16, 64, 128, 4), _BLOCK_128, split=True, norm_m=4),
    # the fma variant over 4 rows (default_gemv_config(4, ..., variant="fma"): 32 x 64)
    "fma-4-rows": _gemv(("fma", 4, 32, 64, 4), _CHANNEL, split=False),
}


@pytest.mark.parametrize("case", list(GEMV_CASES))
def test_fp8_gemv_kernel(case: str) -> None:
    constants, split, has_bias, eps = GEMV_CASES[case]
    types = {
        "w_ptr": "*fp8e4nv", "s_ptr": "*fp32", "part_ptr": "*fp32", "lock_ptr": "*i32",
        "bias_ptr": "*bf16" if has_bias else "*fp32", "eps": eps,
    }  # fmt: skip
    report = _compile("engine_fp8.gemv", "_gemv_kernel", constants, types=types)
    # the parts of a split tile meet through a counter (store_split_k's atomic add)
    assert ("atom.global" in report["ptx"]) == split
    if constants["USE_DOT"]:
        assert "mma" in report["ptx"]


# -- activation quantization (engine_fp8.triton_quant) ----------------------------------------


def test_amax_kernel() -> None:
    """The tensor maximum of a large per-tensor quantization (Llama's K 4096: 8 warps)."""
    report = _compile(
        "engine_fp8.triton_quant", "_amax_kernel", {"BLOCK": 4096},
        types={"amax_ptr": "*fp32"}, num_warps=8,
    )  # fmt: skip
    assert "atom.global" in report["ptx"]


@pytest.mark.parametrize(
    "mode,row_scales,block,scalars",
    [
        (0, True, 1024, "fp32"),  # static input_scale, repeated per row (per-channel weights)
        (1, True, 4096, "fp32"),  # per token
        (2, False, 1024, "fp32"),  # per tensor from _amax_kernel's maximum
        (3, False, 4096, "fp32"),  # per tensor, every program reads the few rows
        # fp8_max and min_scale as float64 (torch.compile passes Python floats so): the
        # kernel casts them to float32 (without it: no float64 -> e4m3 conversion, and
        # div_rn takes float32 only)
        (0, False, 1024, "fp64"),
        (1, True, 1024, "fp64"),
    ],
)
def test_quantize_kernel(mode: int, row_scales: bool, block: int, scalars: str) -> None:
    """``triton_quant.quantize``: BLOCK the row up to 4096, 8 warps above 1024."""
    types = {
        "q_ptr": "*fp8e4nv", "scale_in_ptr": "*fp32", "scale_out_ptr": "*fp32",
        "fp8_max": scalars, "min_scale": scalars,
    }  # fmt: skip
    _compile(
        "engine_fp8.triton_quant", "_quantize_kernel",
        {"MODE": mode, "ROW_SCALES": row_scales, "BLOCK": block}, types=types,
        num_warps=4 if block <= 1024 else 8,
    )  # fmt: skip


# -- the W8A16 GEMM (engine_fp8.w8a16), its parts added by split_k.reduce_split_k ------------


@pytest.mark.parametrize(
    "variant,m,n,k,scale,split,has_bias",
    [
        ("dot", 32, 64, 128, _CHANNEL, True, False),  # 17..32 tokens (GEMV up to 16)
        ("dot", 64, 64, 128, _BLOCK_128, False, True),  # 33..256 tokens, block scales
        # ENGINE_QUANT_GEMV=0: 1..4 tokens on CUDA cores (default_config("fma"))
        ("fma", 1, 128, 64, _TENSOR, True, False),
        ("fma", 4, 32, 64, _CHANNEL, False, True),
    ],
)
def test_w8a16_kernel(
    variant: str, m: int, n: int, k: int, scale: dict[str, int], split: bool, has_bias: bool
) -> None:
    constants = {
        **scale, "BLOCK_M": m, "BLOCK_N": n, "BLOCK_K": k, "USE_DOT": variant == "dot",
        "HAS_BIAS": has_bias, "SPLIT": split,
    }  # fmt: skip
    types = {
        "w_ptr": "*fp8e4nv", "s_ptr": "*fp32", "bias_ptr": "*bf16" if has_bias else "*fp32",
        "out_ptr": "*fp32" if split else "*bf16",  # split: the float32 parts [S, M, N]
    }  # fmt: skip
    report = _compile("engine_fp8.w8a16", "_w8a16_kernel", constants, types=types)
    if variant == "dot":
        assert "mma" in report["ptx"]
