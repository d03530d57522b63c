"""Fused AWQ dequantize-GEMM in Triton: ``out = x @ ((q - z) * s)`` without a dense copy.

Each program computes a BLOCK_M x BLOCK_N tile of ``out`` over one K range (split-K when
there are few tokens, so decode still fills the GPU; partial sums are added atomically in
float32). Per K step it loads a BLOCK_K x BLOCK_N/8 tile of packed int32 words (repeated 8
times in registers, one per column), one row of zeros and scales (BLOCK_K divides the
group size, so a K step never straddles two groups), unpacks in registers and feeds
``tl.dot``::

    x    [M, K]             qweight [K, N/8]      qzeros [K/G, N/8]    scales [K/G, N]
    tile (m, n, split) sums k in [split * k_per_split, (split + 1) * k_per_split)

The packed tensors may be column slices of wider ones (row strides are arguments), so a
layer whose q/k/v weights were merged still runs on its view of the merged tensors.

Column ``n`` of a packed int32 sits at bit ``4 * (j // 2 + 4 * (j % 2))`` with
``j = n % 8`` (AutoAWQ's order, see :mod:`engine_awq.packing`).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

__all__ = ["TARGET_PROGRAMS", "awq_gemm_triton", "pick_block_k"]

TARGET_PROGRAMS = 1024  # ~8 per SM on a 132-SM H100/H200


@triton.jit
def _repeat8(words):
    """[..., n] -> [..., 8n]: every element repeated 8 times in place (w0 x8, w1 x8, ...)."""
    words = tl.interleave(words, words)
    words = tl.interleave(words, words)
    return tl.interleave(words, words)


@triton.jit
def _awq_gemm_kernel(
    x_ptr,
    qweight_ptr,
    qzeros_ptr,
    scales_ptr,
    out_ptr,
    M,
    N,
    K,
    group_size,
    k_per_split,
    stride_xm,
    stride_qw,
    stride_qz,
    stride_s,
    stride_om,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    SPLIT_K: tl.constexpr,
):
    pid_m = tl.program_id(0)
    pid_n = tl.program_id(1)
    pid_k = tl.program_id(2)
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_k = tl.arange(0, BLOCK_K)
    mask_m = offs_m < M
    mask_n = offs_n < N
    num_packed = N // 8
    j = offs_n % 8
    shifts = ((j // 2) + (j % 2) * 4) * 4
    # Each int32 is loaded once and repeated for its 8 columns in registers.
    packed_cols = pid_n * (BLOCK_N // 8) + tl.arange(0, BLOCK_N // 8)
    mask_pn = packed_cols < num_packed

    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    k_start = pid_k * k_per_split
    k_end = tl.minimum(k_start + k_per_split, K)
    for k0 in range(k_start, k_end, BLOCK_K):
        ks = k0 + offs_k
        mask_k = ks < k_end
        x = tl.load(
            x_ptr + offs_m[:, None] * stride_xm + ks[None, :],
            mask=mask_m[:, None] & mask_k[None, :],
            other=0.0,
        )
        packed = tl.load(
            qweight_ptr + ks[:, None] * stride_qw + packed_cols[None, :],
            mask=mask_k[:, None] & mask_pn[None, :],
            other=0,
        )
        packed = _repeat8(packed)
        group = k0 // group_size
        packed_zeros = tl.load(qzeros_ptr + group * stride_qz + packed_cols, mask=mask_pn, other=0)
        packed_zeros = _repeat8(packed_zeros)
        scales = tl.load(scales_ptr + group * stride_s + offs_n, mask=mask_n, other=0.0)
        codes = (packed >> shifts[None, :]) & 0xF
        zeros = (packed_zeros >> shifts) & 0xF
        w = (codes - zeros[None, :]).to(tl.float32) * scales.to(tl.float32)[None, :]
        acc += tl.dot(x, w.to(x.dtype))

    out_ptrs = out_ptr + offs_m[:, None] * stride_om + offs_n[None, :]
    mask = mask_m[:, None] & mask_n[None, :]
    if SPLIT_K == 1:
        tl.store(out_ptrs, acc.to(out_ptr.dtype.element_ty), mask=mask)
    else:
        tl.atomic_add(out_ptrs, acc, mask=mask)


def pick_block_k(group_size: int) -> int | None:
    """The K step: the largest of 64/32/16 dividing the group size (None: no tile fits)."""
    for block_k in (64, 32, 16):
        if group_size % block_k == 0:
            return block_k
    return None


def _tiles(num_tokens: int) -> tuple[int, int]:
    if num_tokens <= 16:
        return 16, 64
    if num_tokens <= 32:
        return 32, 64
    return 64, 64


def awq_gemm_triton(
    x: torch.Tensor,
    qweight: torch.Tensor,
    qzeros: torch.Tensor,
    scales: torch.Tensor,
    group_size: int,
    split_k: int | None = None,
    block_n: int | None = None,
    num_warps: int = 4,
) -> torch.Tensor:
    """``x`` [M, K] (fp16/bf16/fp32) times the AWQ weight [K, N] -> [M, N] in ``x.dtype``.

    ``split_k`` defaults to splitting K so that about ``TARGET_PROGRAMS`` programs run (a
    decode step has one row of tiles, and a K loop per program that waits on memory
    needs many programs per SM to hide it). On a GPU fp32 inputs multiply in TF32.
    """
    num_tokens, num_in = x.shape
    num_out = scales.shape[1]
    block_k = pick_block_k(group_size)
    if block_k is None:
        raise ValueError(f"AWQ group_size {group_size} is not a multiple of 16")
    if qweight.shape != (num_in, num_out // 8):
        raise ValueError(f"qweight shape {tuple(qweight.shape)} does not match x {tuple(x.shape)}")
    # Rows may be strided (a layer's columns viewed inside a merged q/k/v weight); columns
    # must be adjacent.
    assert qweight.stride(1) == qzeros.stride(1) == scales.stride(1) == 1
    x = x.contiguous()
    block_m, default_block_n = _tiles(num_tokens)
    block_n = block_n or default_block_n
    grid_mn = triton.cdiv(num_tokens, block_m) * triton.cdiv(num_out, block_n)
    if split_k is None:
        # Never split below one group (or 128 rows) per split.
        split_k = max(1, min(TARGET_PROGRAMS // grid_mn, num_in // max(group_size, 128)))
    num_groups_per_split = triton.cdiv(num_in // group_size, split_k)
    k_per_split = num_groups_per_split * group_size
    split_k = triton.cdiv(num_in, k_per_split)
    if split_k == 1:
        out = torch.empty(num_tokens, num_out, dtype=x.dtype, device=x.device)
    else:
        out = torch.zeros(num_tokens, num_out, dtype=torch.float32, device=x.device)
    grid = (triton.cdiv(num_tokens, block_m), triton.cdiv(num_out, block_n), split_k)
    _awq_gemm_kernel[grid](
        x,
        qweight,
        qzeros,
        scales,
        out,
        num_tokens,
        num_out,
        num_in,
        group_size,
        k_per_split,
        x.stride(0),
        qweight.stride(0),
        qzeros.stride(0),
        scales.stride(0),
        out.stride(0),
        BLOCK_M=block_m,
        BLOCK_N=block_n,
        BLOCK_K=block_k,
        SPLIT_K=split_k,
        num_warps=num_warps,
    )
    return out.to(x.dtype)
