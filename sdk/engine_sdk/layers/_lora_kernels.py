# mypy: disable-error-code="no-untyped-def,untyped-decorator"
"""Triton kernels of batched LoRA: shrink ``x @ A[slot].T`` and expand ``h @ B[slot].T``.

BGMV-style: every token reads its own adapter slot (``token_slots[t]``; -1: no adapter,
the program writes zeros or returns at once), so one launch serves a batch that mixes
adapters and base requests, and the slot index comes from a device buffer (CUDA graphs
replay it)::

    shrink: program t          h[t, 0:S*R]   = x[t, 0:K] @ A[slot_t, 0:S*R, 0:K].T  (float32)
    expand: program (t, j)     y[t, n0:n1]  += h[t, s*R:(s+1)*R] @ B[slot_t, n0:n1, 0:R].T

One launch each, whatever the number of slices ``S`` of a merged projection (q/k/v: 3,
gate/up: 2); ``R`` is the padded rank of one slice. The shrink covers every slice at once
(``A`` stacks them). The expand's column tiles ``j`` are numbered across the slices, each
tile inside one slice, so a program finds its slice ``s`` and columns ``n0:n1`` from the
slice starts (a device tensor, ``[S + 1]``) and reads that slice's rank block of ``h``::

    columns   | q 0 .. 2047          | k 2048 .. 3071 | v 3072 .. 4095 |   starts 0 2048 3072 4096
    tiles j   | 0 .. 15              | 16 .. 23       | 24 .. 31       |   (BLOCK_N = 128)
    h columns | 0 .. R-1             | R .. 2R-1      | 2R .. 3R-1     |

A slice whose size is not a multiple of ``BLOCK_N`` ends with a partial tile (masked); no
tile spans two slices.
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
    offs_r = tl.arange(0, BLOCK_R)
    acc = tl.zeros((BLOCK_R,), dtype=tl.float32)
    if slot < 0:  # h is not zeroed beforehand (one launch less): write the zeros here
        tl.store(h_ptr + t * stride_ht + offs_r, acc, mask=offs_r < R)
        return
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
def _slice_tile(starts_ptr, N, j, NUM_SLICES: tl.constexpr, BLOCK_N: tl.constexpr):
    """Column tile ``j`` (numbered across the slices, see the module docstring): its slice,
    first column and the end of its slice's columns (the store mask)."""
    if NUM_SLICES == 1:
        return j * 0, j * BLOCK_N, N + j * 0
    s = j * 0
    n0 = j * 0
    n1 = j * 0
    first = j * 0  # the first tile of slice i
    for i in tl.static_range(NUM_SLICES):
        lo = tl.load(starts_ptr + i)
        hi = tl.load(starts_ptr + i + 1)
        last = first + tl.cdiv(hi - lo, BLOCK_N)
        here = (j >= first) & (j < last)
        s = tl.where(here, i, s)
        n0 = tl.where(here, lo + (j - first) * BLOCK_N, n0)
        n1 = tl.where(here, hi, n1)
        first = last
    return s, n0, n1


@triton.jit
def lora_expand_kernel(
    h_ptr, b_ptr, y_ptr, slots_ptr, starts_ptr,
    N, R,
    stride_ht, stride_bs, stride_bn, stride_yt,
    NUM_SLICES: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_R: tl.constexpr,
):  # fmt: skip
    t = tl.program_id(0)
    slot = tl.load(slots_ptr + t)
    if slot < 0:
        return
    s, n0, n1 = _slice_tile(starts_ptr, N, tl.program_id(1), NUM_SLICES, BLOCK_N)
    offs_n = n0 + tl.arange(0, BLOCK_N)
    offs_r = tl.arange(0, BLOCK_R)
    h = tl.load(h_ptr + t * stride_ht + s * R + offs_r, mask=offs_r < R, other=0.0)
    b = tl.load(
        b_ptr + slot.to(tl.int64) * stride_bs + offs_n[:, None] * stride_bn + offs_r[None, :],
        mask=(offs_n[:, None] < n1) & (offs_r[None, :] < R),
        other=0.0,
    ).to(tl.float32)
    out = tl.sum(b * h[None, :], axis=1)
    y_ptrs = y_ptr + t * stride_yt + offs_n
    y = tl.load(y_ptrs, mask=offs_n < n1, other=0.0)
    tl.store(y_ptrs, (y.to(tl.float32) + out).to(y.dtype), mask=offs_n < n1)


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
    h_ptr, b_ptr, y_ptr, slots_ptr, starts_ptr,
    T, N, R, NUM_SLOTS,
    stride_ht, stride_bs, stride_bn, stride_yt,
    NUM_SLICES: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
    BLOCK_R: tl.constexpr, DOT_PRECISION: tl.constexpr,
):  # fmt: skip
    offs_m = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    s, n0, n1 = _slice_tile(starts_ptr, N, tl.program_id(1), NUM_SLICES, BLOCK_N)
    offs_n = n0 + tl.arange(0, BLOCK_N)
    mask_m = offs_m < T
    row_slots = tl.load(slots_ptr + offs_m, mask=mask_m, other=-1)
    offs_r = tl.arange(0, BLOCK_R)
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    any_rows = tl.sum((row_slots >= 0).to(tl.int32), axis=0) > 0
    for slot in range(0, NUM_SLOTS):
        rows = row_slots == slot
        if tl.sum(rows.to(tl.int32), axis=0) > 0:
            h = tl.load(
                h_ptr + offs_m[:, None] * stride_ht + s * R + offs_r[None, :],
                mask=rows[:, None] & (offs_r[None, :] < R),
                other=0.0,
            )
            b = tl.load(
                b_ptr + slot * stride_bs + offs_n[None, :] * stride_bn + offs_r[:, None],
                mask=(offs_n[None, :] < n1) & (offs_r[:, None] < R),
                other=0.0,
            )  # [BLOCK_R, BLOCK_N]: B[slot].T
            acc += tl.dot(h.to(b.dtype), b, input_precision=DOT_PRECISION)
    if any_rows:
        y_ptrs = y_ptr + offs_m[:, None] * stride_yt + offs_n[None, :]
        mask = (row_slots[:, None] >= 0) & (offs_n[None, :] < n1)
        y = tl.load(y_ptrs, mask=mask, other=0.0)
        tl.store(y_ptrs, (y.to(tl.float32) + acc).to(y.dtype), mask=mask)
