# mypy: disable-error-code="no-untyped-def,untyped-decorator"
"""Triton kernels of batched LoRA: shrink ``x @ A[slot].T`` and expand ``h @ B[slot].T``.

BGMV-style: every token reads its own adapter slot (``token_slots[t]``; -1: no adapter,
the program returns at once), so one launch serves a batch that mixes adapters and base
requests, and the slot index comes from a device buffer (CUDA graphs replay it)::

    shrink: program t          h[t, 0:R]     = x[t, 0:K] @ A[slot_t, 0:R, 0:K].T  (float32)
    expand: program (t, n0)    y[t, n0:n0+BN] += h[t, 0:R] @ B[slot_t, n0:n0+BN, 0:R].T

``R`` is the slot rank (all of a merged projection's slices: ``num_slices * max_rank``).
"""

from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def lora_shrink_kernel(
    x_ptr, a_ptr, h_ptr, slots_ptr,
    K, R,
    stride_xt, stride_as, stride_ar, stride_ht,
    BLOCK_R: tl.constexpr, BLOCK_K: tl.constexpr,
):  # fmt: skip
    t = tl.program_id(0)
    slot = tl.load(slots_ptr + t)
    if slot < 0:
        return
    offs_r = tl.arange(0, BLOCK_R)
    acc = tl.zeros((BLOCK_R,), dtype=tl.float32)
    a_base = a_ptr + slot.to(tl.int64) * stride_as
    for k0 in range(0, K, BLOCK_K):
        offs_k = k0 + tl.arange(0, BLOCK_K)
        x = tl.load(x_ptr + t * stride_xt + offs_k, mask=offs_k < K, other=0.0).to(tl.float32)
        a = tl.load(
            a_base + offs_r[:, None] * stride_ar + offs_k[None, :],
            mask=(offs_r[:, None] < R) & (offs_k[None, :] < K),
            other=0.0,
        ).to(tl.float32)
        acc += tl.sum(a * x[None, :], axis=1)
    tl.store(h_ptr + t * stride_ht + offs_r, acc, mask=offs_r < R)


@triton.jit
def lora_expand_kernel(
    h_ptr, b_ptr, y_ptr, slots_ptr,
    N, R,
    stride_ht, stride_bs, stride_bn, stride_yt,
    BLOCK_N: tl.constexpr, BLOCK_R: tl.constexpr,
):  # fmt: skip
    t = tl.program_id(0)
    n0 = tl.program_id(1) * BLOCK_N
    slot = tl.load(slots_ptr + t)
    if slot < 0:
        return
    offs_n = n0 + tl.arange(0, BLOCK_N)
    offs_r = tl.arange(0, BLOCK_R)
    h = tl.load(h_ptr + t * stride_ht + offs_r, mask=offs_r < R, other=0.0)
    b = tl.load(
        b_ptr + slot.to(tl.int64) * stride_bs + offs_n[:, None] * stride_bn + offs_r[None, :],
        mask=(offs_n[:, None] < N) & (offs_r[None, :] < R),
        other=0.0,
    ).to(tl.float32)
    out = tl.sum(b * h[None, :], axis=1)
    y_ptrs = y_ptr + t * stride_yt + offs_n
    y = tl.load(y_ptrs, mask=offs_n < N, other=0.0)
    tl.store(y_ptrs, (y.to(tl.float32) + out).to(y.dtype), mask=offs_n < N)
