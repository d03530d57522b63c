"""The SDK's launched Triton kernels build for an sm90 target (H100/H200) from a CPU machine:
Triton's whole compile, ptxas included (``engine_sdk.testing.gpu_compile``), which the
interpreter tests never run. Constants are the ones the wrappers pick for Qwen3-0.6B
(hidden 1024, intermediate 3072, 16 q / 8 kv heads of 128) and, where they depend on the
shape, Llama-3.1-8B (hidden 4096, intermediate 14336); bf16 activations. Float scalars
(``eps``) are compiled as float32, as a launch passes a Python float, and as float64, as
torch.compile's wrapper of user Triton kernels may pass it. The decode kernels of LoRA and
the GEMV's LoRA epilogue are in ``test_kernels_compile_sm90.py``."""

from __future__ import annotations

from typing import Any

import pytest
from engine_sdk.testing.gpu_compile import compile_for_gpu

_FUSED = "engine_sdk.layers._fused_kernels"
_MOE = "engine_sdk.layers._moe_kernels"
_GEMV = "engine_sdk.layers._gemv_kernels"
_LORA = "engine_sdk.layers._lora_kernels"


def _compile(module: str, kernel: str, constants: dict[str, Any], **kw: Any) -> dict[str, Any]:
    """Compile (left-out constexprs take their defaults, as in a launch); it must build."""
    report = compile_for_gpu(module, kernel, constants, **kw)
    assert report["cubin_bytes"] > 0
    return report


# -- fused_ops: RMSNorm (with the residual add), SiLU-and-mul, rope, q/k/v split -------------


@pytest.mark.parametrize(
    "kernel,block,eps",
    [
        ("rms_norm_kernel", 1024, "fp32"),  # Qwen3-0.6B hidden
        ("rms_norm_kernel", 4096, "fp64"),  # Llama-3.1-8B hidden
        ("add_rms_norm_kernel", 1024, "fp64"),
        ("add_rms_norm_kernel", 4096, "fp32"),
    ],
)
def test_rms_norm_kernels(kernel: str, block: int, eps: str) -> None:
    """``fused_ops.rms_norm`` / ``add_rms_norm``: BLOCK the row rounded up, four warps."""
    _compile(_FUSED, kernel, {"BLOCK": block}, types={"eps": eps})


@pytest.mark.parametrize("kernel", ["silu_mul_kernel", "silu_mul_merged_kernel"])
def test_silu_mul_kernels(kernel: str) -> None:
    """``fused_ops.silu_and_mul`` / ``silu_and_mul_merged``: BLOCK 1024."""
    _compile(_FUSED, kernel, {"BLOCK": 1024})


@pytest.mark.parametrize(
    "heads_p,half_p,pass_p,has_pass",
    [
        (16, 64, 1, False),  # q of Qwen3-0.6B: rope over the whole head of 128
        (8, 32, 64, True),  # k, partial rope (rotary_dim 64): 64 dims pass through
    ],
)
def test_rotary_kernel(heads_p: int, half_p: int, pass_p: int, has_pass: bool) -> None:
    constants = {"HEADS_P": heads_p, "HALF_P": half_p, "PASS_P": pass_p, "HAS_PASS": has_pass}
    _compile(_FUSED, "rotary_kernel", constants)


def test_qkv_norm_rope_without_norm() -> None:
    """The q/k/v split of a model without q/k norms (Llama-3.1-8B: 32 q heads, 8 kv), no KV
    store, eps as float32 (the normed and stored variants: ``test_kernels_compile_sm90``)."""
    constants = {
        "HEAD_DIM": 128, "HALF_P": 64, "HEADS_P": 32, "HAS_NORM": False, "STORE": False,
        "FP8": False,
    }  # fmt: skip
    types = {"slot_ptr": "*i64", "kv_scales_ptr": "*fp32", "eps": "fp32"}
    _compile(_FUSED, "qkv_norm_rope_kernel", constants, types=types)


# -- FusedMoE: the grouped gate/up and down GEMMs ---------------------------------------------

_MOE_TYPES = {
    "slots_ptr": "*i32", "block_expert_ptr": "*i32", "weights_ptr": "*fp32", "out_ptr": "*fp32",
}  # fmt: skip


@pytest.mark.parametrize("kernel", ["_gate_up_kernel", "_down_kernel"])
@pytest.mark.parametrize("block_m", [16, 64])  # decode (<= 64 slots) / prefill
def test_moe_kernels(kernel: str, block_m: int) -> None:
    """``fused_moe``: BLOCK_N and BLOCK_K ``_tile`` of hidden / intermediate (64 for every
    real MoE shape), bf16 operands on tensor cores."""
    constants = {"BLOCK_M": block_m, "BLOCK_N": 64, "BLOCK_K": 64, "DOT_PRECISION": "tf32"}
    report = _compile(_MOE, kernel, constants, types=_MOE_TYPES)
    assert "mma" in report["ptx"]  # tensor cores (mma.sync or wgmma)


# -- split_k: the reduce launch of the W4A16 / W8A16 GEMMs ------------------------------------


@pytest.mark.parametrize("has_bias", [False, True])
def test_reduce_split_k_kernel(has_bias: bool) -> None:
    """``reduce_split_k``: float32 parts -> bf16 output, BLOCK min(1024, N)."""
    types = {"partials_ptr": "*fp32"}
    _compile(
        "engine_sdk.layers.split_k", "_reduce_kernel", {"HAS_BIAS": has_bias, "BLOCK": 1024},
        types=types,
    )  # fmt: skip


# -- the bf16 GEMV (no LoRA epilogue) ---------------------------------------------------------


@pytest.mark.parametrize(
    "block_m,block_k,has_bias",
    [
        (1, 2048, False),  # one row: o_proj (K 2048) / down (K 3072) / Llama's, K chunks of 2048
        (4, 1024, True),  # four rows, K 1024 in one chunk, a bias (Qwen2-style)
    ],
)
def test_gemv_kernel(block_m: int, block_k: int, has_bias: bool) -> None:
    """``gemv``: ``pick_tiles`` gives BLOCK_N 2, BLOCK_K min(2048, K), four warps."""
    constants = {
        "HAS_BIAS": has_bias, "BLOCK_M": block_m, "BLOCK_N": 2, "BLOCK_K": block_k,
        "LORA": False,
    }  # fmt: skip
    report = _compile(_GEMV, "gemv_kernel", constants)
    assert "atom.global" not in report["ptx"]  # no LoRA, no shrink: no counters


@pytest.mark.parametrize("stages", [0, 2])
@pytest.mark.parametrize("weight", ["*bf16", "*fp8e4nv"])
def test_gemv_kernel_loop_pipelines_only_with_stages(weight: str, stages: int) -> None:
    """``STAGES`` (``gemv.LOOP_STAGES``): the K loop's weight rows travel by cp.async into
    shared memory a step ahead; without it the launch's ``num_stages`` (3 here) leaves the
    loop's plain loads. The rows a program are the launches' (2 bf16, ``FP8_BLOCK_N``)."""
    from engine_sdk.layers import gemv

    fp8 = weight == "*fp8e4nv"
    constants = {
        "HAS_BIAS": False, "BLOCK_M": 1, "BLOCK_N": gemv.FP8_BLOCK_N if fp8 else 2,
        "BLOCK_K": 2048, "LORA": False, "SCALE": 2 if fp8 else 0, "STAGES": stages,
    }  # fmt: skip
    # as the launches specialize them: aligned pointers, K and the row stride multiples of 16
    aligned = ["x_ptr", "w_ptr", "out_ptr", "K", "stride_wn"]
    types = {"w_ptr": weight, "s_ptr": "*fp32"}
    report = _compile(_GEMV, "gemv_kernel", constants, types=types, aligned=aligned)
    assert ("cp.async" in report["ptx"]) == (stages >= 2)


def test_gemv_kernel_float32_logits() -> None:
    """The LM head's GEMV (``ENGINE_GEMV_LM_HEAD=1``): bf16 weights, float32 logits out."""
    constants = {"HAS_BIAS": False, "BLOCK_M": 1, "BLOCK_N": 2, "BLOCK_K": 1024, "LORA": False}
    _compile(_GEMV, "gemv_kernel", constants, types={"out_ptr": "*fp32"})


@pytest.mark.parametrize(
    "block_k,warps,eps,has_bias",
    [
        (1024, 4, "fp32", False),  # Qwen3-0.6B q/k/v and gate/up after the norm
        (4096, 8, "fp64", True),  # Llama-3.1-8B (K 4096: eight warps), a bias
    ],
)
def test_gemv_add_rms_norm_kernel(block_k: int, warps: int, eps: str, has_bias: bool) -> None:
    """``gemv_add_rms_norm``: the whole row in one tile (BLOCK_K = K rounded up)."""
    constants = {
        "HAS_BIAS": has_bias, "BLOCK_M": 1, "BLOCK_N": 2, "BLOCK_K": block_k, "LORA": False,
    }  # fmt: skip
    _compile(_GEMV, "gemv_add_rms_norm_kernel", constants, types={"eps": eps}, num_warps=warps)


@pytest.mark.parametrize("block_n,block_k,warps", [(1, 1024, 4), (2, 4096, 8)])
def test_gated_gemv_add_rms_norm_kernel(block_n: int, block_k: int, warps: int) -> None:
    """The gated variant (gate/up with SiLU in the epilogue): one gate and one up row a
    program (the default) or two of each, Qwen3-0.6B and Llama-8B row lengths, a bias."""
    constants = {
        "HAS_BIAS": True, "BLOCK_M": 1, "BLOCK_N": block_n, "BLOCK_K": block_k, "LORA": False,
        "GATED": True,
    }  # fmt: skip
    report = _compile(_GEMV, "gemv_add_rms_norm_kernel", constants, num_warps=warps)
    assert "ex2" in report["ptx"]  # the SiLU's exponential is in the launch


@pytest.mark.parametrize("scale", [1, 2])
def test_gemv_kernels_with_a_float8_weight(scale: int) -> None:
    """The row GEMVs over an e4m3 weight (``engine_fp8``'s tensor and channel layouts at
    one row): plain, add+RMSNorm and gated, the scale a float32 pointer; the codes are
    widened from e4m3 in registers (``cvt`` from ``e4m3x2``). The rows a program are the
    ones the launches take (``FP8_BLOCK_N``, ``FP8_GATED_BLOCK_N``)."""
    from engine_sdk.layers import gemv

    types = {"w_ptr": "*fp8e4nv", "s_ptr": "*fp32"}
    base = {"HAS_BIAS": False, "BLOCK_M": 1, "BLOCK_K": 1024, "LORA": False, "SCALE": scale}
    plain = {**base, "BLOCK_N": gemv.FP8_BLOCK_N}
    report = _compile(_GEMV, "gemv_kernel", plain, types=types)
    assert "e4m3" in report["ptx"]
    _compile(_GEMV, "gemv_add_rms_norm_kernel", plain, types=types)
    gated = {**base, "BLOCK_N": gemv.FP8_GATED_BLOCK_N, "GATED": True}
    _compile(_GEMV, "gemv_add_rms_norm_kernel", gated, types=types)


# -- LoRA: the per-token shrink and expand, the blocked shrink --------------------------------

_LORA_TYPES = {"parts_ptr": "*fp32", "h_ptr": "*fp32", "slots_ptr": "*i32", "starts_ptr": "*i32"}


def test_lora_shrink_kernel() -> None:
    """``lora_shrink_triton`` at decode: 16 rank rows and K steps of 128 a program."""
    _compile(_LORA, "lora_shrink_kernel", {"BLOCK_R": 16, "BLOCK_K": 128}, types=_LORA_TYPES)


@pytest.mark.parametrize(
    "slices,parts",
    [
        (3, 8),  # q/k/v (columns 2048 | 1024 | 1024) from a shrink of 8 parts (K 1024)
        (1, 1),  # o_proj from a plain h
    ],
)
def test_lora_expand_kernel(slices: int, parts: int) -> None:
    """``lora_expand_triton`` below ``BLOCKED_MIN_TOKENS``: BLOCK_N 128, rank 16."""
    constants = {"NUM_SLICES": slices, "BLOCK_N": 128, "BLOCK_R": 16, "BLOCK_P": parts}
    _compile(_LORA, "lora_expand_kernel", constants, types=_LORA_TYPES)


def test_lora_shrink_blocked_kernel() -> None:
    """``lora_shrink_triton`` from ``BLOCKED_MIN_TOKENS``: 16 tokens a program, the q/k/v
    adapter's 3 x 16 rank rows (BLOCK_R 64), K steps of 64, bf16 dots (precision None)."""
    constants = {"NUM_SLOTS": 4, "BLOCK_M": 16, "BLOCK_R": 64, "BLOCK_K": 64, "DOT_PRECISION": None}
    report = _compile(_LORA, "lora_shrink_blocked_kernel", constants, types=_LORA_TYPES)
    assert "mma" in report["ptx"]
