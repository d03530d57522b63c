# mypy: disable-error-code="no-untyped-def,untyped-decorator"
"""Weight-only FP8 GEMM (W8A16) for few tokens, in Triton: fp8 weights are read once and
upcast in registers; activations stay in their dtype (no activation quantization).

``out [M, N] = x [M, K] @ (w [N, K] * scale).T`` with ``w`` float8 e4m3 row-major (the
checkpoint's ``nn.Linear`` orientation: a row's K values are contiguous, so a tile's rows
are 16-byte loads). Scales (``SCALE``):

    tensor   one float32                    applied to the accumulator at the end
    channel  [N] (a [N, 1] tensor)          applied per output column at the end
    block    [ceil(N/b0), ceil(K/b1)]       applied per K step (``BLOCK_K`` divides b1)

so a merged q/k/v or gate/up layer (per-tensor scales become per channel) costs nothing
more than separate ones. A program owns ``BLOCK_N`` columns and ``BLOCK_M`` rows over a
range of K steps (split-K, as :mod:`engine_sdk.layers.split_k` describes); the next step's
weights are requested before this step's arithmetic. Inner products (``VARIANT``): ``fma``
(CUDA cores; few rows) or ``dot`` (tensor cores; the fp8 tile converted to x's dtype).
"""

from __future__ import annotations

from typing import NamedTuple

import torch
import triton
import triton.language as tl

__all__ = ["GemmConfig", "default_config", "fp8_w8a16_gemm", "supports_block"]

PROGRAMS_PER_SM = 4
SCALE_TENSOR, SCALE_CHANNEL, SCALE_BLOCK = 0, 1, 2


class GemmConfig(NamedTuple):
    """Tile shape and launch options of one W8A16 GEMM call."""

    variant: str  # "fma" or "dot"
    block_m: int
    block_n: int
    block_k: int
    num_warps: int = 4
    split: int | None = None  # None: fill the GPU (PROGRAMS_PER_SM per multiprocessor)


@triton.jit
def _w8a16_kernel(
    x_ptr,
    w_ptr,
    s_ptr,
    bias_ptr,
    out_ptr,
    M,
    N,
    K,
    steps_per_split,
    stride_xm,
    stride_wn,
    stride_sn,
    stride_sk,
    stride_op,
    stride_om,
    SCALE: tl.constexpr,
    SCALE_ROWS: tl.constexpr,
    SCALE_COLS: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    USE_DOT: tl.constexpr,
    HAS_BIAS: tl.constexpr,
    SPLIT: tl.constexpr,
):
    pid_n = tl.program_id(0)
    pid_s = tl.program_id(1)
    pid_m = tl.program_id(2)
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_k = tl.arange(0, BLOCK_K)
    mask_m = offs_m < M
    mask_n = offs_n < N
    x_rows = x_ptr + offs_m[:, None] * stride_xm + offs_k[None, :]
    w_rows = w_ptr + offs_n[:, None] * stride_wn + offs_k[None, :]
    k_start = pid_s * steps_per_split * BLOCK_K
    k_end = tl.minimum(k_start + steps_per_split * BLOCK_K, K)
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    w_mask = mask_n[:, None] & (k_start + offs_k < k_end)[None, :]
    w = tl.load(w_rows + k_start, mask=w_mask, other=0.0)
    for k0 in range(k_start, k_end, BLOCK_K):
        # Ask for the next step's weights before this step's arithmetic.
        k1 = k0 + BLOCK_K
        nxt_mask = mask_n[:, None] & (k1 + offs_k < k_end)[None, :]
        nxt = tl.load(w_rows + k1, mask=nxt_mask, other=0.0)
        x = tl.load(x_rows + k0, mask=mask_m[:, None] & (k0 + offs_k < k_end)[None, :], other=0.0)
        if USE_DOT:
            part = tl.dot(x, tl.trans(w.to(x.dtype)))
        elif BLOCK_M == 1:  # decode: [1, BLOCK_K] broadcast over the [BLOCK_N, BLOCK_K] tile
            part = tl.sum(x.to(tl.float32) * w.to(tl.float32), axis=1)[None, :]
        else:
            prod = x.to(tl.float32)[:, None, :] * w.to(tl.float32)[None, :, :]
            part = tl.sum(prod, axis=2)
        if SCALE == 2:
            s_tile = s_ptr + (offs_n // SCALE_ROWS) * stride_sn + (k0 // SCALE_COLS) * stride_sk
            acc += part * tl.load(s_tile, mask=mask_n, other=0.0)[None, :]
        else:
            acc += part
        w = nxt
    if SCALE == 0:
        acc = acc * tl.load(s_ptr)
    elif SCALE == 1:
        acc = acc * tl.load(s_ptr + offs_n * stride_sn, mask=mask_n, other=0.0)[None, :]
    mask = mask_m[:, None] & mask_n[None, :]
    if SPLIT:
        out_tile = out_ptr + pid_s * stride_op + offs_m[:, None] * stride_om + offs_n[None, :]
        tl.store(out_tile, acc, mask=mask)
    else:
        if HAS_BIAS:
            acc += tl.load(bias_ptr + offs_n, mask=mask_n, other=0.0).to(tl.float32)[None, :]
        out_tile = out_ptr + offs_m[:, None] * stride_om + offs_n[None, :]
        tl.store(out_tile, acc.to(out_ptr.dtype.element_ty), mask=mask)


def supports_block(block: tuple[int, int] | None) -> bool:
    """Whether block scales of this shape fit the kernel's K steps (b1 a multiple of 16)."""
    return block is None or block[1] % 16 == 0


def default_config(
    num_tokens: int, num_out: int, variant: str, block: tuple[int, int] | None = None
) -> GemmConfig:
    """The tile for ``num_tokens`` rows in ``variant`` (``fma`` | ``dot``); ``block`` caps
    ``BLOCK_K`` at the scale block's columns."""
    if variant == "fma":
        block_m = min(triton.next_power_of_2(num_tokens), 16)
        block_k = 64
        # The [BLOCK_M, BLOCK_N, BLOCK_K] product tile lives in registers.
        block_n = max(16, min(128 if num_out >= 4096 else 64, 8192 // (block_m * block_k)))
    else:
        block_m = 16 if num_tokens <= 16 else 32 if num_tokens <= 32 else 64
        # A [64, 128] fp8 tile (8 KB) and the next one stay in registers with its bf16 copy.
        block_n, block_k = 64, 128
    if block is not None:
        while block[1] % block_k:
            block_k //= 2
    return GemmConfig(variant, block_m, block_n, block_k)


def fp8_w8a16_gemm(
    x: torch.Tensor,
    weight: torch.Tensor,
    weight_scale: torch.Tensor,
    block: tuple[int, int] | None = None,
    bias: torch.Tensor | None = None,
    config: GemmConfig | None = None,
) -> torch.Tensor:
    """``x`` [M, K] (fp16/bf16; fp32 for tests) times ``(weight * weight_scale).T`` ->
    [M, N] in ``x.dtype``, plus ``bias``. ``weight`` float8 [N, K] with contiguous rows
    (row blocks of a merged weight are fine); ``weight_scale`` float32: one element, [N, 1]
    per channel, or block tiles with ``block`` = (b0, b1)."""
    from engine_sdk.layers.split_k import num_multiprocessors, pick_split, reduce_split_k

    num_tokens, num_in = x.shape
    num_out = weight.shape[0]
    assert weight.shape[1] == num_in and weight.stride(1) == 1 and x.stride(1) == 1
    assert supports_block(block)
    if config is None:
        config = default_config(num_tokens, num_out, "fma" if num_tokens <= 4 else "dot", block)
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
    m_tiles = triton.cdiv(num_tokens, config.block_m)
    n_tiles = triton.cdiv(num_out, config.block_n)
    if config.split is None:
        target = PROGRAMS_PER_SM * num_multiprocessors(x.device)
        split, steps_per_split = pick_split(m_tiles * n_tiles, num_steps, target)
    else:
        split, steps_per_split = pick_split(1, num_steps, config.split)
    if split > 1:
        out = torch.empty(split, num_tokens, num_out, dtype=torch.float32, device=x.device)
        stride_op, stride_om = out.stride(0), out.stride(1)
    else:
        out = torch.empty(num_tokens, num_out, dtype=x.dtype, device=x.device)
        stride_op, stride_om = 0, out.stride(0)
    _w8a16_kernel[(n_tiles, split, m_tiles)](
        x, weight, weight_scale, bias if bias is not None else weight_scale, out,
        num_tokens, num_out, num_in, steps_per_split,
        x.stride(0), weight.stride(0), stride_sn, stride_sk, stride_op, stride_om,
        SCALE=mode, SCALE_ROWS=scale_rows, SCALE_COLS=scale_cols,
        BLOCK_M=config.block_m, BLOCK_N=config.block_n, BLOCK_K=config.block_k,
        USE_DOT=config.variant == "dot", HAS_BIAS=bias is not None, SPLIT=split > 1,
        num_warps=config.num_warps,
    )  # fmt: skip
    if split > 1:
        return reduce_split_k(out, bias, x.dtype)
    return out
