# mypy: disable-error-code="no-untyped-def,untyped-decorator"
"""Split-K weight-only FP8 GEMV (W8A16) for decode batches (1 to ``MAX_TOKENS`` tokens), in
one Triton launch.

``out [M, N] = x [M, K] @ (w [N, K] * scale).T``, ``w`` float8 e4m3 row-major (the
checkpoint's ``nn.Linear`` orientation), activations in their dtype::

    grid (cdiv(N, BLOCK_N), S)   program (t, s): columns [t * BLOCK_N, +BLOCK_N), K steps
                                 [s * P, (s + 1) * P) of BLOCK_K (P = steps_per_split)

    one step = a [BLOCK_N, BLOCK_K] fp8 tile, BLOCK_K contiguous bytes a weight row

The loop's loads are pipelined by Triton (``NUM_STAGES`` steps in flight, cp.async), and
the ``S`` parts of a tile meet in the same launch
(:func:`engine_sdk.layers.split_k.store_split_k`: the last program of a tile adds them
in a fixed order), so a projection is one kernel, which a CUDA graph replays without a
memset. Scales (``SCALE``), as :mod:`engine_fp8.w8a16`:

    tensor   one float32                    applied to the program's sum at the end
    channel  [N] (a [N, 1] tensor)          applied per output column at the end
    block    [ceil(N/b0), ceil(K/b1)]       applied per K step (``BLOCK_K`` divides b1)

Variants: ``fma`` (CUDA cores; one token keeps a [BLOCK_N, BLOCK_K] product tile across
the steps and, unless block scales change per step, reduces it once) and ``dot`` (tensor
cores, weight first: ``out^T [BLOCK_N, 16] = w tile @ x^T``, the 16-row side of the
instruction holds the tokens; the fp8 tile converted to the activations' dtype).
"""

from __future__ import annotations

from typing import NamedTuple

import torch
import triton
import triton.language as tl
from engine_sdk.layers.pdl import pdl_launch, pdl_start
from engine_sdk.layers.split_k import (
    NormArgs,
    norm_args,
    norm_launch_args,
    norm_rows_into,
    plan_split_k,
    store_split_k_tile,
    tuned_config,
)

__all__ = [
    "GEMV_PROGRAMS_PER_SM",
    "MAX_TOKENS",
    "GemvConfig",
    "default_gemv_config",
    "fp8_gemv",
    "fp8_gemv_add_rms_norm",
    "gemv_config",
]

MAX_TOKENS = 16  # rows the GEMV takes (the dot variant's 16-row side)
GEMV_PROGRAMS_PER_SM = 2  # split K until about this many programs per multiprocessor
SCALE_TENSOR, SCALE_CHANNEL, SCALE_BLOCK = 0, 1, 2


class GemvConfig(NamedTuple):
    """Tile shape and launch options of one GEMV call."""

    variant: str  # "fma" or "dot"
    block_n: int
    block_k: int
    num_warps: int = 4
    num_stages: int = 4  # K steps in flight per program (Triton's pipelined loads)
    split: int | None = None  # None: about GEMV_PROGRAMS_PER_SM programs per multiprocessor


@triton.jit
def _gemv_kernel(
    x_ptr,
    w_ptr,
    s_ptr,
    bias_ptr,
    out_ptr,
    part_ptr,
    lock_ptr,
    M,
    N,
    K,
    steps_per_split,
    num_splits,
    stride_xm,
    stride_wn,
    stride_sn,
    stride_sk,
    stride_om,
    r_ptr,
    nw_ptr,
    xn_ptr,
    res_ptr,
    eps,
    stride_rm,
    SCALE: tl.constexpr,
    SCALE_ROWS: tl.constexpr,
    SCALE_COLS: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    NUM_STAGES: tl.constexpr,
    USE_DOT: tl.constexpr,
    HAS_BIAS: tl.constexpr,
    SPLIT: tl.constexpr,
    NORM: tl.constexpr,
    NORM_M: tl.constexpr,
    NORM_BLOCK: tl.constexpr,
    PDL: tl.constexpr = False,
):
    pdl_start(PDL)
    pid_n = tl.program_id(0)
    pid_s = tl.program_id(1)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_m = tl.arange(0, BLOCK_M)
    offs_k = tl.arange(0, BLOCK_K)
    mask_n = offs_n < N
    mask_m = offs_m < M
    k_begin = pid_s * steps_per_split * BLOCK_K
    k_end = tl.minimum(k_begin + steps_per_split * BLOCK_K, K)
    if NORM:  # x := rms_norm(x + r) * nw over this program's K range (split_k.norm_rows_into)
        norm_rows_into(
            x_ptr, r_ptr, nw_ptr, xn_ptr, res_ptr, M, K, eps, k_begin, k_end, stride_xm,
            stride_rm, pid_n == 0, NORM_M, NORM_BLOCK,
        )  # fmt: skip
        x_ptr = xn_ptr
        stride_xm = K
    w_rows = w_ptr + offs_n[:, None] * stride_wn + offs_k[None, :]  # [BLOCK_N, BLOCK_K]
    s_rows = s_ptr + (offs_n // SCALE_ROWS) * stride_sn  # block scales of each row
    if USE_DOT:
        acc = tl.zeros((BLOCK_N, BLOCK_M), dtype=tl.float32)  # out^T
        xt_ptrs = x_ptr + offs_k[:, None] + offs_m[None, :] * stride_xm  # [BLOCK_K, BLOCK_M]
    elif BLOCK_M == 1:
        acc1 = tl.zeros((BLOCK_N,), dtype=tl.float32)
        prod = tl.zeros((BLOCK_N, BLOCK_K), dtype=tl.float32)
    else:
        acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
        x_rows = x_ptr + offs_m[:, None] * stride_xm + offs_k[None, :]  # [BLOCK_M, BLOCK_K]
    for k0 in tl.range(k_begin, k_end, BLOCK_K, num_stages=NUM_STAGES):
        mask_k = k0 + offs_k < k_end
        w = tl.load(w_rows + k0, mask=mask_n[:, None] & mask_k[None, :], other=0.0)
        if SCALE == 2:
            s = tl.load(s_rows + (k0 // SCALE_COLS) * stride_sk, mask=mask_n, other=0.0)
        if USE_DOT:
            xt = tl.load(xt_ptrs + k0, mask=mask_k[:, None] & mask_m[None, :], other=0.0)
            if SCALE == 2:
                acc += s[:, None] * tl.dot(w.to(xt.dtype), xt)
            else:
                acc = tl.dot(w.to(xt.dtype), xt, acc)
        elif BLOCK_M == 1:
            x = tl.load(x_ptr + k0 + offs_k, mask=mask_k, other=0.0).to(tl.float32)
            if SCALE == 2:  # the scale changes with the step: reduce the step now
                acc1 += s * tl.sum(x[None, :] * w.to(tl.float32), axis=1)
            else:  # reduce once, after the loop
                prod += x[None, :] * w.to(tl.float32)
        else:
            x = tl.load(x_rows + k0, mask=mask_m[:, None] & mask_k[None, :], other=0.0)
            part = tl.sum(x.to(tl.float32)[:, None, :] * w.to(tl.float32)[None, :, :], axis=2)
            if SCALE == 2:
                acc += s[None, :] * part
            else:
                acc += part

    if USE_DOT:  # acc is out^T: [BLOCK_N, BLOCK_M]
        if SCALE == 0:
            acc = acc * tl.load(s_ptr)
        elif SCALE == 1:
            acc = acc * tl.load(s_ptr + offs_n * stride_sn, mask=mask_n, other=0.0)[:, None]
    else:
        if BLOCK_M == 1:
            if SCALE != 2:
                acc1 = tl.sum(prod, axis=1)
            acc = acc1[None, :]
        if SCALE == 0:
            acc = acc * tl.load(s_ptr)
        elif SCALE == 1:
            acc = acc * tl.load(s_ptr + offs_n * stride_sn, mask=mask_n, other=0.0)[None, :]
    store_split_k_tile(
        acc, out_ptr, part_ptr, bias_ptr, lock_ptr + pid_n, offs_m, offs_n, M, N, stride_om,
        pid_s, num_splits, USE_DOT, HAS_BIAS, SPLIT,
    )  # fmt: skip


def default_gemv_config(
    num_tokens: int,
    num_out: int,
    block: tuple[int, int] | None = None,
    variant: str | None = None,
) -> GemvConfig:
    """The tile for ``num_tokens`` rows (first guesses, to retune from
    ``benchmarks/quant_gemv_gpu.py``). ``variant`` None picks ``fma`` up to
    ``GEMV_FMA_MAX_TOKENS`` of :mod:`engine_fp8.method`, else ``dot``; ``block`` caps
    ``BLOCK_K`` at the scale block's columns."""
    from engine_fp8.method import GEMV_FMA_MAX_TOKENS

    if variant is None:
        variant = "fma" if num_tokens <= GEMV_FMA_MAX_TOKENS else "dot"
    if variant == "dot":
        config = GemvConfig("dot", 64, 128)
    else:
        block_m = triton.next_power_of_2(num_tokens)
        block_n, block_k = (64, 128) if block_m == 1 else (32, 64)
        # The [BLOCK_M, BLOCK_N, BLOCK_K] product tile of several tokens lives in registers.
        while block_m * block_n * block_k > 8192 and block_k > 16:
            block_n, block_k = (block_n // 2, block_k) if block_n > 16 else (block_n, block_k // 2)
        config = GemvConfig("fma", block_n, block_k)
    if block is not None:
        block_k = config.block_k
        while block[1] % block_k:
            block_k //= 2
        config = config._replace(block_k=block_k)
    return config


def gemv_config(
    device: torch.device,
    num_tokens: int,
    num_out: int,
    num_in: int,
    block: tuple[int, int] | None = None,
    norm: bool = False,
) -> GemvConfig:
    """The tile a layer runs: the measured one for this GPU and shape
    (``engine_fp8/tuned/<device>.json``, :func:`engine_sdk.layers.split_k.tuned_config`,
    swept per channel; a block-scaled weight takes it when its ``BLOCK_K`` divides the
    scale block's columns), else :func:`default_gemv_config`. ``norm``: the launch with the
    add+RMSNorm prologue, whose rows (``fp8_norm``) come first: every program of a tile
    re-forms the row's norm, so a few-rows tile that wins alone can lose there."""
    found = None
    if norm:
        found = tuned_config("engine_fp8", "fp8_norm", device, num_out, num_in, num_tokens)
    if found is None:
        found = tuned_config("engine_fp8", "fp8", device, num_out, num_in, num_tokens)
    if found is not None:
        config = GemvConfig(**{k: v for k, v in found.items() if k in GemvConfig._fields})
        if block is None or block[1] % config.block_k == 0:
            return config
    return default_gemv_config(num_tokens, num_out, block)


def fp8_gemv(
    x: torch.Tensor,
    weight: torch.Tensor,
    weight_scale: torch.Tensor,
    block: tuple[int, int] | None = None,
    bias: torch.Tensor | None = None,
    config: GemvConfig | None = None,
    locks: torch.Tensor | None = None,
) -> torch.Tensor:
    """``x`` [M, K] (1 <= M <= 16; fp16/bf16, fp32 for tests) times ``(weight *
    weight_scale).T`` -> [M, N] in ``x.dtype``, plus ``bias``. ``weight`` float8 [N, K]
    with contiguous rows (row blocks of a merged weight are fine); ``weight_scale`` float32:
    one element, [N, 1] per channel, or block tiles with ``block`` = (b0, b1). ``locks``:
    the caller's split-K counters (:func:`engine_sdk.layers.split_k.split_k_locks`, at
    least ``cdiv(N, block_n)``); None makes zeroed ones per call."""
    return _launch(x, weight, weight_scale, block, bias, config, locks, None)


def fp8_gemv_add_rms_norm(
    x: torch.Tensor,
    residual: torch.Tensor,
    norm_weight: torch.Tensor,
    eps: float,
    weight: torch.Tensor,
    weight_scale: torch.Tensor,
    block: tuple[int, int] | None = None,
    bias: torch.Tensor | None = None,
    config: GemvConfig | None = None,
    locks: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """:func:`fp8_gemv` of ``rms_norm(x + residual) * norm_weight`` and ``x + residual``
    (the new residual) in one launch, for at most ``NORM_MAX_ROWS`` rows of
    :mod:`engine_sdk.layers.split_k`: equal to the decoder's add+norm kernel, then
    :func:`fp8_gemv`."""
    norm = norm_args(x, residual, norm_weight, eps)
    out = _launch(x, weight, weight_scale, block, bias, config, locks, norm)
    return out, norm.new_residual


def _launch(
    x: torch.Tensor,
    weight: torch.Tensor,
    weight_scale: torch.Tensor,
    block: tuple[int, int] | None,
    bias: torch.Tensor | None,
    config: GemvConfig | None,
    locks: torch.Tensor | None,
    norm: NormArgs | None,
) -> torch.Tensor:
    """One launch of the GEMV, with the add+norm prologue when ``norm`` is given."""
    num_tokens, num_in = x.shape
    num_out = weight.shape[0]
    assert 0 < num_tokens <= MAX_TOKENS, f"the GEMV takes 1 to {MAX_TOKENS} rows"
    assert weight.shape[1] == num_in and weight.stride(1) == 1 and x.stride(1) == 1
    if config is None:
        config = gemv_config(x.device, num_tokens, num_out, num_in, block, norm is not None)
    use_dot = config.variant == "dot"
    block_m = 16 if use_dot else triton.next_power_of_2(num_tokens)
    assert not use_dot or min(config.block_n, config.block_k) >= 16
    if block is not None:
        assert block[1] % config.block_k == 0, "BLOCK_K must divide the scale block"
        mode, scale_rows, scale_cols = SCALE_BLOCK, block[0], block[1]
        stride_sn, stride_sk = weight_scale.stride(0), weight_scale.stride(1)
    elif weight_scale.numel() == 1:
        mode, scale_rows, scale_cols, stride_sn, stride_sk = SCALE_TENSOR, 1, 1, 0, 0
    else:
        assert weight_scale.numel() == num_out
        mode, scale_rows, scale_cols = SCALE_CHANNEL, 1, 1
        stride_sn, stride_sk = weight_scale.stride(0), 0
    num_steps = triton.cdiv(num_in, config.block_k)
    n_tiles = triton.cdiv(num_out, config.block_n)
    plan = plan_split_k(x, num_out, n_tiles, num_steps, GEMV_PROGRAMS_PER_SM, config.split, locks)
    norm_operands, norm_constants = norm_launch_args(x, norm)
    _gemv_kernel[(n_tiles, plan.split)](
        x, weight, weight_scale, bias if bias is not None else weight_scale, plan.out,
        plan.parts, plan.locks, num_tokens, num_out, num_in, plan.steps_per_split, plan.split,
        x.stride(0), weight.stride(0), stride_sn, stride_sk, plan.out.stride(0),
        *norm_operands,
        SCALE=mode, SCALE_ROWS=scale_rows, SCALE_COLS=scale_cols,
        BLOCK_M=block_m, BLOCK_N=config.block_n, BLOCK_K=config.block_k,
        NUM_STAGES=config.num_stages, USE_DOT=use_dot, HAS_BIAS=bias is not None,
        SPLIT=plan.split > 1, num_warps=config.num_warps, **norm_constants, **pdl_launch(x),
    )  # fmt: skip
    return plan.out
