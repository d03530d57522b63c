"""The AWQ plugin's Triton kernels build for an sm90 target (H100/H200) from a CPU machine:
Triton's whole compile, ptxas included (``engine_sdk.testing.gpu_compile``), which the
interpreter tests never run. Constants are the ones the launches pick: the measured H100
tiles (``engine_awq/tuned``) for Qwen3-0.6B (hidden 1024, q/k/v 4096 columns) and
Llama-3.1-8B (intermediate 14336), and the default tiles; bf16 activations, int32 packed
weights, uint8 zero points (tiled layout) or packed int32 ones (AutoAWQ layout), fp16
scales as the checkpoint stores them (``AwqLinearMethod.create_weights``), group size 128
(and 64, smaller than a chunk). ``eps`` is compiled as float32 (a launch's Python float)
and as float64 (as torch.compile may pass it)."""

from __future__ import annotations

import math
from typing import Any

import pytest
from engine_sdk.testing.gpu_compile import compile_for_gpu

_TILED = {"qw_ptr": "*i32", "z_ptr": "*u8", "s_ptr": "*fp16"}


def _compile(module: str, kernel: str, constants: dict[str, Any], **kw: Any) -> dict[str, Any]:
    """Compile (left-out constexprs take their defaults, as in a launch); it must build."""
    report = compile_for_gpu(module, kernel, constants, **kw)
    assert report["cubin_bytes"] > 0
    return report


def _bias(has_bias: bool) -> str:
    """``bias if bias is not None else scales``: the layer's bf16 bias or the fp16 scales."""
    return "*bf16" if has_bias else "*fp16"


# -- the split-K decode GEMV (engine_awq.gemv), with and without the add+RMSNorm prologue ----


def _gemv(
    tile: tuple[str, int, int, int],
    split: bool,
    bias: bool = False,
    norm_m: int = 0,
    eps: str = "fp32",
    group: int = 128,
    chunk: int = 128,
    warps: int = 4,
) -> tuple[dict[str, Any], bool, str, int]:
    """(constants, SPLIT, eps type, num_warps) of a launch: ``tile`` (variant, BLOCK_M,
    BLOCK_N, NUM_STAGES); ``norm_m`` > 0: the add+RMSNorm prologue for that many rows of K
    1024 (``split_k.norm_launch_args``: NORM_BLOCK min(K, 4096 / NORM_M))."""
    variant, m, n, stages = tile
    norm = {"NORM": norm_m > 0, "NORM_M": max(norm_m, 1), "NORM_BLOCK": 1024 if norm_m else 16}
    constants = {
        **norm, "GROUP": group, "CHUNK": chunk, "NPG": math.gcd(8, group // (chunk // 8)),
        "USE_DOT": variant == "dot", "BLOCK_M": m, "BLOCK_N": n, "NUM_STAGES": stages,
        "SPLIT": split, "HAS_BIAS": bias,
    }  # fmt: skip
    return constants, split, eps, warps


GEMV_CASES = {
    # tuned awq_c128,4096,1024,1 (0.6B q/k/v, one token): 64 columns, 2 stages, split 8
    "qkv-0.6B": _gemv(("fma", 1, 64, 2), split=True),
    # the same tile with the add+RMSNorm prologue (one row of K 1024)
    "qkv-norm-0.6B": _gemv(("fma", 1, 64, 2), split=True, norm_m=1),
    "qkv-norm-0.6B-eps-fp64": _gemv(("fma", 1, 64, 2), split=True, norm_m=1, eps="fp64"),
    # 2..16 tokens: the dot variant (default tile), 64 columns for N < 4096, a bias
    "dot-bias": _gemv(("dot", 16, 64, 4), split=True, bias=True),
    # the dot variant with the prologue for 4 rows, 128 columns (0.6B q/k/v: N 4096)
    "dot-norm": _gemv(("dot", 16, 128, 4), split=True, norm_m=4),
    # group 64: two group slices of four nibbles a chunk; no split, two warps (as several
    # tuned tiles)
    "fma-group64": _gemv(("fma", 1, 64, 2), split=False, group=64, warps=2),
    # several rows on CUDA cores, 64-row chunks (K not a multiple of 128): [4, 128, 8] tile
    "fma-4-rows-chunk64": _gemv(("fma", 4, 128, 4), split=True, chunk=64),
}


@pytest.mark.parametrize("case", list(GEMV_CASES))
def test_awq_gemv_kernel(case: str) -> None:
    constants, split, eps, warps = GEMV_CASES[case]
    types = {
        **_TILED, "bias_ptr": _bias(constants["HAS_BIAS"]), "part_ptr": "*fp32",
        "lock_ptr": "*i32", "magic": "i32", "eps": eps,
    }  # fmt: skip
    report = _compile("engine_awq.gemv", "_gemv_kernel", constants, types=types, num_warps=warps)
    # the parts of a split tile meet through a counter (store_split_k's atomic add)
    assert ("atom.global" in report["ptx"]) == split
    if constants["USE_DOT"]:
        assert "mma" in report["ptx"]


# -- the row GEMV (engine_awq.rows): plain, add+RMSNorm, gated ------------------------------

ROWS_CASES = {
    # one token, 0.6B q/k/v shape: 2 columns, 8 chunks of 128 a step (the whole K 1024)
    "plain": {"BLOCK_M": 1, "BLOCK_N": 2, "BLOCK_C": 8},
    # 8B down: 16 chunks a step (BLOCK_K 2048, the default), K 14336 in 7 steps
    "plain-8B-down": {"BLOCK_M": 1, "BLOCK_N": 2, "BLOCK_C": 16},
    # the add+RMSNorm prologue over a row of K 1024, a bias (Qwen2 q/k/v)
    "norm-bias": {
        "BLOCK_M": 1,
        "BLOCK_N": 2,
        "BLOCK_C": 8,
        "NORM": True,
        "NORM_K": 1024,
        "HAS_BIAS": True,
    },
    # the merged gate/up with the SiLU epilogue (8B hidden 4096: 16 chunks, two steps)
    "gated": {
        "BLOCK_M": 1,
        "BLOCK_N": 2,
        "BLOCK_C": 8,
        "NORM": True,
        "NORM_K": 4096,
        "GATED": True,
    },
    # four rows, 4 columns, group 64 (two groups a chunk), 64-row chunks
    "rows4-group64-chunk64": {"BLOCK_M": 4, "BLOCK_N": 4, "BLOCK_C": 8, "CHUNK": 64, "GROUP": 64},
}


@pytest.mark.parametrize("case", list(ROWS_CASES))
def test_awq_rows_kernel(case: str) -> None:
    constants = {"GROUP": 128, "CHUNK": 128, "HAS_BIAS": False, **ROWS_CASES[case]}
    constants["NPG"] = math.gcd(8, constants["GROUP"] // (constants["CHUNK"] // 8))
    types = {**_TILED, "b_ptr": _bias(constants["HAS_BIAS"]), "eps": "fp32", "magic": "i32"}
    report = _compile("engine_awq.rows", "awq_rows_kernel", constants, types=types)
    # no split-K: nothing to meet through a counter
    assert "atom.global" not in report["ptx"]


# -- the one-token GEMV for long rows (engine_awq.wide): the default tiles -------------------

WIDE_CASES = {
    # 8B o / q/k/v: 8 columns, 32 chunks a step (the whole K 4096), two warps
    "plain-8B": ({"BLOCK_N": 8, "BLOCK_C": 32}, 2),
    # 8B down: K 14336 in 4 steps of 32 chunks (the last half masked)
    "plain-8B-down": ({"BLOCK_N": 8, "BLOCK_C": 32}, 2),
    "norm-8B-bias": (
        {"BLOCK_N": 8, "BLOCK_C": 32, "NORM": True, "NORM_K": 4096, "HAS_BIAS": True},
        2,
    ),
    # the merged gate/up: 4 gate and 4 up columns
    "gated-8B": ({"BLOCK_N": 4, "BLOCK_C": 32, "NORM": True, "NORM_K": 4096, "GATED": True}, 2),
    # group 64: two slices a chunk; 16 chunks, one warp
    "plain-group64": ({"BLOCK_N": 8, "BLOCK_C": 16, "GROUP": 64}, 1),
}


@pytest.mark.parametrize("case", list(WIDE_CASES))
def test_awq_wide_kernel(case: str) -> None:
    """Builds, with no counters and no flush-to-zero (the codes are read as subnormals)."""
    extra, warps = WIDE_CASES[case]
    constants = {"GROUP": 128, "CHUNK": 128, "HAS_BIAS": False, **extra}
    constants["NPG"] = math.gcd(8, constants["GROUP"] // (constants["CHUNK"] // 8))
    types = {**_TILED, "b_ptr": _bias(constants["HAS_BIAS"]), "eps": "fp32"}
    report = _compile("engine_awq.wide", "awq_wide_kernel", constants, types=types, num_warps=warps)
    ptx = report["ptx"]
    assert "atom.global" not in ptx and "fma.rn.f32" in ptx
    assert "fma.rn.ftz" not in ptx  # (the prologue's rsqrt.approx.ftz is not a code)


# -- the W4A16 GEMM and the dequantization (engine_awq.w4a16) ---------------------------------


@pytest.mark.parametrize(
    "variant,m,n,group,split,has_bias",
    [
        ("dot", 32, 128, 128, True, False),  # 17..32 tokens (GEMV up to 16), N >= 4096
        ("dot", 64, 64, 64, False, True),  # 33..256 tokens, groups smaller than a chunk
        # ENGINE_QUANT_GEMV=0: 1..4 tokens on CUDA cores (default_config("fma"))
        ("fma", 1, 128, 128, True, False),
        ("fma", 4, 128, 128, False, True),
    ],
)
def test_w4a16_kernel(
    variant: str, m: int, n: int, group: int, split: bool, has_bias: bool
) -> None:
    constants = {
        "GROUP": group, "CHUNK": 128, "BLOCK_M": m, "BLOCK_N": n, "USE_DOT": variant == "dot",
        "HAS_BIAS": has_bias, "SPLIT": split,
    }  # fmt: skip
    types = {
        **_TILED, "bias_ptr": _bias(has_bias),
        "out_ptr": "*fp32" if split else "*bf16",  # split: the float32 parts [S, M, N]
    }  # fmt: skip
    report = _compile("engine_awq.w4a16", "_w4a16_kernel", constants, types=types)
    if variant == "dot":
        assert "mma" in report["ptx"]


@pytest.mark.parametrize("group,chunk", [(128, 128), (64, 128)])
def test_dequant_kernel(group: int, chunk: int) -> None:
    """``awq_w4a16_dequantize`` (the large-batch path): 64 columns a program."""
    constants = {"GROUP": group, "CHUNK": chunk, "BLOCK_N": 64}
    _compile("engine_awq.w4a16", "_dequant_kernel", constants, types=_TILED)


# -- the fused dequantize-GEMM on AutoAWQ's layout (engine_awq.triton_gemm) -------------------


@pytest.mark.parametrize(
    "m,split_k",
    [
        (16, 8),  # one token: K 1024 in 8 parts of one group, added by float32 atomics
        (64, 1),  # a prefill tile, no split
    ],
)
def test_awq_gemm_kernel(m: int, split_k: int) -> None:
    """``awq_gemm_triton``: BLOCK_N 64, BLOCK_K 64 (group 128), four warps."""
    constants = {"BLOCK_M": m, "BLOCK_N": 64, "BLOCK_K": 64, "SPLIT_K": split_k}
    types = {
        "qweight_ptr": "*i32", "qzeros_ptr": "*i32", "scales_ptr": "*fp16",
        "out_ptr": "*fp32" if split_k > 1 else "*bf16",
    }  # fmt: skip
    report = _compile("engine_awq.triton_gemm", "_awq_gemm_kernel", constants, types=types)
    assert "mma" in report["ptx"]
    # the split parts are added with float32 atomics (atom.global....add.f32)
    assert ("atom.global" in report["ptx"]) == (split_k > 1)


# -- the row GEMV's K loop pipelined (STAGES, engine_awq.rows.LOOP_STAGES) --------------------


@pytest.mark.parametrize("stages", [0, 2, 3])
def test_awq_rows_loop_pipelines_only_with_stages(stages: int) -> None:
    """The 8B gate/up tile (8 columns, 1024 activations a step, gated): with ``STAGES`` the
    code words and activations travel by cp.async into shared memory, ``STAGES - 1`` steps
    ahead; without, the launch's ``num_stages`` (3 here) leaves the loop's plain loads."""
    constants = {"GROUP": 128, "CHUNK": 128, "NPG": 8, "BLOCK_M": 1, "BLOCK_N": 8,
                 "BLOCK_C": 8, "HAS_BIAS": False, "GATED": True, "STAGES": stages}  # fmt: skip
    types = {**_TILED, "b_ptr": _bias(False), "eps": "fp32", "magic": "i32"}
    report = _compile("engine_awq.rows", "awq_rows_kernel", constants, types=types)
    assert ("cp.async" in report["ptx"]) == (stages >= 2)
    if stages >= 2:  # a buffer for each step in flight: 8 columns x 8 chunks x 16 words x 2
        assert report["shared"] >= (stages - 1) * 2 * 8 * 8 * 16 * 4
