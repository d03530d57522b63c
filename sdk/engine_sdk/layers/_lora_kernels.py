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


# -- blocked versions for many tokens (prefill chunks) ----------------------------------------
#
# SGMV-style: a program takes BLOCK_M consecutive tokens. Tokens of one request are
# consecutive in a step, so most blocks hold one slot; for each slot present in the block
# (a loop over the few slots, skipped when absent) one tl.dot over the rows of that slot,
# the other rows masked to zero. A is read once per block and slot instead of per token.
#
#   rows  t0 t1 t2 t3 | t4 t5 t6 t7      slots  2 2 2 2 | 2 2 -1 0
#   block 0: slot 2 only -> one dot      block 1: slot 2 dot (rows 4,5) + slot 0 dot (row 7)


@triton.jit
def lora_shrink_blocked_kernel(
    x_ptr, a_ptr, h_ptr, slots_ptr,
    T, K, R, NUM_SLOTS,
    stride_xt, stride_as, stride_ar, stride_ht,
    BLOCK_M: tl.constexpr, BLOCK_R: tl.constexpr, BLOCK_K: tl.constexpr,
    DOT_PRECISION: tl.constexpr,
):  # fmt: skip
    offs_m = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    mask_m = offs_m < T
    row_slots = tl.load(slots_ptr + offs_m, mask=mask_m, other=-1)
    offs_r = tl.arange(0, BLOCK_R)
    acc = tl.zeros((BLOCK_M, BLOCK_R), dtype=tl.float32)
    for slot in range(0, NUM_SLOTS):
        rows = row_slots == slot
        if tl.sum(rows.to(tl.int32), axis=0) > 0:
            a_base = a_ptr + slot * stride_as
            for k0 in range(0, K, BLOCK_K):
                offs_k = k0 + tl.arange(0, BLOCK_K)
                x = tl.load(
                    x_ptr + offs_m[:, None] * stride_xt + offs_k[None, :],
                    mask=rows[:, None] & (offs_k[None, :] < K),
                    other=0.0,
                )
                a = tl.load(
                    a_base + offs_r[None, :] * stride_ar + offs_k[:, None],
                    mask=(offs_r[None, :] < R) & (offs_k[:, None] < K),
                    other=0.0,
                )  # [BLOCK_K, BLOCK_R]: A[slot].T
                acc += tl.dot(x, a.to(x.dtype), input_precision=DOT_PRECISION)
    tl.store(
        h_ptr + offs_m[:, None] * stride_ht + offs_r[None, :],
        acc,
        mask=mask_m[:, None] & (offs_r[None, :] < R),
    )


@triton.jit
def lora_expand_blocked_kernel(
    h_ptr, b_ptr, y_ptr, slots_ptr,
    T, N, R, NUM_SLOTS,
    stride_ht, stride_bs, stride_bn, stride_yt,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_R: tl.constexpr,
    DOT_PRECISION: tl.constexpr,
):  # fmt: skip
    offs_m = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    mask_m = offs_m < T
    row_slots = tl.load(slots_ptr + offs_m, mask=mask_m, other=-1)
    offs_r = tl.arange(0, BLOCK_R)
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    any_rows = tl.sum((row_slots >= 0).to(tl.int32), axis=0) > 0
    for slot in range(0, NUM_SLOTS):
        rows = row_slots == slot
        if tl.sum(rows.to(tl.int32), axis=0) > 0:
            h = tl.load(
                h_ptr + offs_m[:, None] * stride_ht + offs_r[None, :],
                mask=rows[:, None] & (offs_r[None, :] < R),
                other=0.0,
            )
            b = tl.load(
                b_ptr + slot * stride_bs + offs_n[None, :] * stride_bn + offs_r[:, None],
                mask=(offs_n[None, :] < N) & (offs_r[:, None] < R),
                other=0.0,
            )  # [BLOCK_R, BLOCK_N]: B[slot].T
            acc += tl.dot(h.to(b.dtype), b, input_precision=DOT_PRECISION)
    if any_rows:
        y_ptrs = y_ptr + offs_m[:, None] * stride_yt + offs_n[None, :]
        mask = (row_slots[:, None] >= 0) & (offs_n[None, :] < N)
        y = tl.load(y_ptrs, mask=mask, other=0.0)
        tl.store(y_ptrs, (y.to(tl.float32) + acc).to(y.dtype), mask=mask)
