# mypy: disable-error-code="no-untyped-def,untyped-decorator"
"""Triton kernels of batched LoRA: shrink ``x @ A[slot].T`` and expand ``h @ B[slot].T``.

BGMV-style: every token reads its own adapter slot (``token_slots[t]``; -1: no adapter,
the program writes zeros or returns at once), so one launch serves a batch that mixes
adapters and base requests, and the slot index comes from a device buffer (CUDA graphs
replay it).

The decode shrink splits its work three ways, so that one token still runs on many
multiprocessors: token ``t``, a block ``b`` of ``BLOCK_R`` (16) rank rows ``r0:r1`` and
a part ``p`` of the reduction ``K``. Each program writes its partial product (float32)
into ``parts``, zeros for a slot -1 token (no memset, no atomics: deterministic); the
expand adds the ``P`` parts as it loads its block of ``h`` (``R`` floats per part), so a
projection stays two launches::

    shrink: program (t, b, p)  parts[p, t, r0:r1] = x[t, kp] @ A[slot_t, r0:r1, kp].T
                               kp = p*K_PER_PART : (p+1)*K_PER_PART   (last part: to K)
    expand: program (t, j)     h_s = sum_p parts[p, t, s*R:(s+1)*R]
                               y[t, n0:n1] += h_s @ B[slot_t, n0:n1, 0:R].T

``A`` stacks the ``S`` slices of a merged projection (q/k/v: 3, gate/up: 2) as ``S*R``
rows, ``R`` the padded rank of one slice; ``h`` (the sum of the parts) has ``S*R``
columns. The expand's column tiles ``j`` are numbered across the slices, each tile inside
one slice, so a program finds its slice ``s`` and columns ``n0:n1`` from the slice starts
(a device tensor, ``[S + 1]``) and reads that slice's rank block of ``h``::

    columns   | q 0 .. 2047          | k 2048 .. 3071 | v 3072 .. 4095 |   starts 0 2048 3072 4096
    tiles j   | 0 .. 15              | 16 .. 23       | 24 .. 31       |   (BLOCK_N = 128)
    h columns | 0 .. R-1             | R .. 2R-1      | 2R .. 3R-1     |

A slice whose size is not a multiple of ``BLOCK_N`` ends with a partial tile (masked); no
tile spans two slices. A plain ``h`` ``[T, S*R]`` is one part.
"""

from __future__ import annotations

import triton
import triton.language as tl

from engine_sdk.layers._fused_kernels import silu_mul


# Ints that follow the step's token count are not specialized on (``do_not_specialize``):
# one compiled kernel per projection for every batch and prefill size, so no request ever
# waits for a compile after startup (Triton would otherwise compile a variant for an int
# equal to 1 and one for a multiple of 16).
@triton.jit(do_not_specialize=["K_PER_PART", "stride_pp"])
def lora_shrink_kernel(
    x_ptr, a_ptr, parts_ptr, slots_ptr,
    K, R, K_PER_PART,
    stride_xt, stride_as, stride_ar, stride_pp, stride_pt,
    BLOCK_R: tl.constexpr, BLOCK_K: tl.constexpr,
):  # fmt: skip
    t = tl.program_id(0)
    offs_r = tl.program_id(1) * BLOCK_R + tl.arange(0, BLOCK_R)
    part = tl.program_id(2)
    out_ptrs = parts_ptr + part * stride_pp + t * stride_pt + offs_r
    slot = tl.load(slots_ptr + t)
    if slot < 0:  # parts are not zeroed beforehand (one launch less): write the zeros here
        tl.store(out_ptrs, tl.zeros((BLOCK_R,), dtype=tl.float32), mask=offs_r < R)
        return
    a_base = a_ptr + slot.to(tl.int64) * stride_as
    k_start = part * K_PER_PART
    k_end = tl.minimum(k_start + K_PER_PART, K)
    # a 2-D accumulator: one cross-lane reduction at the end, not one per K step
    acc = tl.zeros((BLOCK_R, BLOCK_K), dtype=tl.float32)
    for k0 in range(k_start, k_end, BLOCK_K):
        offs_k = k0 + tl.arange(0, BLOCK_K)
        mask_k = offs_k < k_end
        x = tl.load(x_ptr + t * stride_xt + offs_k, mask=mask_k, other=0.0).to(tl.float32)
        a = tl.load(
            a_base + offs_r[:, None] * stride_ar + offs_k[None, :],
            mask=(offs_r[:, None] < R) & mask_k[None, :],
            other=0.0,
        ).to(tl.float32)
        acc += a * x[None, :]
    tl.store(out_ptrs, tl.sum(acc, axis=1), mask=offs_r < R)


@triton.jit
def lora_shrink_add_rms_norm_kernel(
    x_ptr, res_ptr, nw_ptr, a_ptr, parts_ptr, slots_ptr,
    K, R, K_PER_PART, eps,
    stride_xt, stride_rt, stride_as, stride_ar, stride_pp, stride_pt,
    BLOCK_R: tl.constexpr, BLOCK_K: tl.constexpr, ROW_P: tl.constexpr,
):  # fmt: skip
    """``lora_shrink_kernel`` over ``rms_norm(x + res) * nw``, the input the fused
    add+RMSNorm GEMV (``gemv_add_rms_norm_kernel``) forms for its projection, with the
    same roundings: every program first sums the squares of the whole row (a few KB, from
    L2, ``ROW_P`` >= K values in one load), then normalizes only its own part of K."""
    t = tl.program_id(0)
    offs_r = tl.program_id(1) * BLOCK_R + tl.arange(0, BLOCK_R)
    part = tl.program_id(2)
    out_ptrs = parts_ptr + part * stride_pp + t * stride_pt + offs_r
    slot = tl.load(slots_ptr + t)
    if slot < 0:
        tl.store(out_ptrs, tl.zeros((BLOCK_R,), dtype=tl.float32), mask=offs_r < R)
        return
    dtype = x_ptr.dtype.element_ty
    offs_row = tl.arange(0, ROW_P)  # the whole row in one load (one wait for L2, not K/BLOCK_K)
    row_ok = offs_row < K
    x_row = tl.load(x_ptr + t * stride_xt + offs_row, mask=row_ok, other=0.0).to(tl.float32)
    r_row = tl.load(res_ptr + t * stride_rt + offs_row, mask=row_ok, other=0.0).to(tl.float32)
    s_row = (x_row + r_row).to(dtype).to(tl.float32)
    inv = tl.rsqrt(tl.sum(s_row * s_row, axis=0) / K + eps)
    a_base = a_ptr + slot.to(tl.int64) * stride_as
    k_start = part * K_PER_PART
    k_end = tl.minimum(k_start + K_PER_PART, K)
    acc = tl.zeros((BLOCK_R, BLOCK_K), dtype=tl.float32)
    for k0 in range(k_start, k_end, BLOCK_K):
        offs_k = k0 + tl.arange(0, BLOCK_K)
        mask_k = offs_k < k_end
        x = tl.load(x_ptr + t * stride_xt + offs_k, mask=mask_k, other=0.0).to(tl.float32)
        r = tl.load(res_ptr + t * stride_rt + offs_k, mask=mask_k, other=0.0).to(tl.float32)
        nw = tl.load(nw_ptr + offs_k, mask=mask_k, other=0.0).to(tl.float32)
        v = (x + r).to(dtype).to(tl.float32)
        y = (v * inv).to(dtype).to(tl.float32)
        h = (y * nw).to(dtype).to(tl.float32)
        a = tl.load(
            a_base + offs_r[:, None] * stride_ar + offs_k[None, :],
            mask=(offs_r[:, None] < R) & mask_k[None, :],
            other=0.0,
        ).to(tl.float32)
        acc += a * h[None, :]
    tl.store(out_ptrs, tl.sum(acc, axis=1), mask=offs_r < R)


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


@triton.jit(do_not_specialize=["NUM_PARTS", "stride_hp"])
def lora_expand_kernel(
    h_ptr, b_ptr, y_ptr, slots_ptr, starts_ptr,
    N, R, NUM_PARTS,
    stride_hp, stride_ht, stride_bs, stride_bn, stride_yt,
    NUM_SLICES: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_R: tl.constexpr,
    BLOCK_P: tl.constexpr,
):  # fmt: skip
    t = tl.program_id(0)
    slot = tl.load(slots_ptr + t)
    if slot < 0:
        return
    s, n0, n1 = _slice_tile(starts_ptr, N, tl.program_id(1), NUM_SLICES, BLOCK_N)
    offs_n = n0 + tl.arange(0, BLOCK_N)
    offs_r = tl.arange(0, BLOCK_R)
    offs_p = tl.arange(0, BLOCK_P)  # the shrink's parts, added here: one load, one sum
    h = tl.load(
        h_ptr + offs_p[:, None] * stride_hp + t * stride_ht + s * R + offs_r[None, :],
        mask=(offs_p[:, None] < NUM_PARTS) & (offs_r[None, :] < R),
        other=0.0,
    )
    h = tl.sum(h, axis=0)
    b = tl.load(
        b_ptr + slot.to(tl.int64) * stride_bs + offs_n[:, None] * stride_bn + offs_r[None, :],
        mask=(offs_n[:, None] < n1) & (offs_r[None, :] < R),
        other=0.0,
    ).to(tl.float32)
    out = tl.sum(b * h[None, :], axis=1)
    y_ptrs = y_ptr + t * stride_yt + offs_n
    y = tl.load(y_ptrs, mask=offs_n < n1, other=0.0)
    tl.store(y_ptrs, (y.to(tl.float32) + out).to(y.dtype), mask=offs_n < n1)


# -- blocked versions for many tokens (large decode batches, prefill chunks) -----------------
#
# SGMV-style: a program takes BLOCK_M consecutive tokens. Tokens of one request are
# consecutive in a step, so most blocks hold one slot; each slot's weights are loaded with
# a mask that is off where the slot has no row in the block (no memory traffic), one
# tl.dot per slot over the block's rows, the other rows' results dropped. A is read once
# per block and slot instead of per token.
#
#   rows  t0 t1 t2 t3 | t4 t5 t6 t7      slots  2 2 2 2 | 2 2 -1 0
#   block 0: slot 2's loads only         block 1: slot 2 (rows 4,5) and slot 0 (row 7)
#
# The loop over the slots is unrolled (NUM_SLOTS is a constexpr: --max-loras) and has no
# branch, so all the slots' loads leave together: a decode block mixing four adapters
# waits for memory once per K step, not once per slot (round 11: the branchy loop cost
# about 6 us a launch at 128 tokens on an H100, four dependent round trips). The token
# count is not specialized on (prefill chunks of every size share one compiled kernel).
#
# The shrink splits K as the per-token one does (grid: token blocks x K parts), since a
# decode batch has few blocks (256 tokens: 16); the expand adds the parts as it loads its
# block of h, once for all the block's slots.


@triton.jit(do_not_specialize=["T", "K_PER_PART", "stride_pp"])
def lora_shrink_blocked_kernel(
    x_ptr, a_ptr, parts_ptr, slots_ptr,
    T, K, R, K_PER_PART,
    stride_xt, stride_as, stride_ar, stride_pp, stride_pt,
    NUM_SLOTS: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_R: tl.constexpr,
    BLOCK_K: tl.constexpr, DOT_PRECISION: tl.constexpr,
):  # fmt: skip
    offs_m = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    part = tl.program_id(1)  # this program's K range: [part * K_PER_PART, +K_PER_PART)
    k_start = part * K_PER_PART
    k_end = tl.minimum(k_start + K_PER_PART, K)
    mask_m = offs_m < T
    row_slots = tl.load(slots_ptr + offs_m, mask=mask_m, other=-1)
    offs_r = tl.arange(0, BLOCK_R)
    r_ok = offs_r < R
    acc = tl.zeros((BLOCK_M, BLOCK_R), dtype=tl.float32)
    for k0 in range(k_start, k_end, BLOCK_K):
        offs_k = k0 + tl.arange(0, BLOCK_K)
        k_ok = offs_k < k_end
        x = tl.load(
            x_ptr + offs_m[:, None] * stride_xt + offs_k[None, :],
            mask=(row_slots >= 0)[:, None] & k_ok[None, :],
            other=0.0,
        )
        for slot in tl.static_range(NUM_SLOTS):
            rows = row_slots == slot
            present = tl.sum(rows.to(tl.int32), axis=0) > 0
            a = tl.load(
                a_ptr + slot * stride_as + offs_r[None, :] * stride_ar + offs_k[:, None],
                mask=present & r_ok[None, :] & k_ok[:, None],
                other=0.0,
            )  # [BLOCK_K, BLOCK_R]: A[slot].T
            d = tl.dot(x, a.to(x.dtype), input_precision=DOT_PRECISION)
            acc += tl.where(rows[:, None], d, 0.0)
    # every row of the block, zeros for slot -1 (the parts are not zeroed beforehand)
    tl.store(
        parts_ptr + part * stride_pp + offs_m[:, None] * stride_pt + offs_r[None, :],
        acc,
        mask=mask_m[:, None] & r_ok[None, :],
    )


@triton.jit(do_not_specialize=["T", "NUM_PARTS", "stride_hp"])
def lora_expand_blocked_kernel(
    h_ptr, b_ptr, y_ptr, slots_ptr, starts_ptr,
    T, N, R, NUM_PARTS,
    stride_hp, stride_ht, stride_bs, stride_bn, stride_yt,
    NUM_SLOTS: tl.constexpr, NUM_SLICES: tl.constexpr, BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr, BLOCK_R: tl.constexpr, DOT_PRECISION: tl.constexpr,
    BLOCK_P: tl.constexpr,
):  # fmt: skip
    offs_m = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    s, n0, n1 = _slice_tile(starts_ptr, N, tl.program_id(1), NUM_SLICES, BLOCK_N)
    offs_n = n0 + tl.arange(0, BLOCK_N)
    mask_m = offs_m < T
    row_slots = tl.load(slots_ptr + offs_m, mask=mask_m, other=-1)
    if tl.sum((row_slots >= 0).to(tl.int32), axis=0) > 0:
        offs_r = tl.arange(0, BLOCK_R)
        n_ok = offs_n < n1
        y_ptrs = y_ptr + offs_m[:, None] * stride_yt + offs_n[None, :]
        mask = (row_slots[:, None] >= 0) & n_ok[None, :]
        y = tl.load(y_ptrs, mask=mask, other=0.0)  # issued with the loads below
        # this slice's rank block of h for the whole block, the shrink's K parts added:
        # one [BLOCK_P, BLOCK_M, BLOCK_R] load and one sum (not one wait for L2 per part)
        offs_p = tl.arange(0, BLOCK_P)
        h_ptrs = (
            h_ptr
            + offs_p[:, None, None] * stride_hp
            + offs_m[None, :, None] * stride_ht
            + s * R
            + offs_r[None, None, :]
        )
        h_mask = (
            (offs_p[:, None, None] < NUM_PARTS)
            & (row_slots[None, :, None] >= 0)
            & (offs_r[None, None, :] < R)
        )
        h = tl.sum(tl.load(h_ptrs, mask=h_mask, other=0.0), axis=0)
        acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
        for slot in tl.static_range(NUM_SLOTS):
            rows = row_slots == slot
            present = tl.sum(rows.to(tl.int32), axis=0) > 0
            b = tl.load(
                b_ptr + slot * stride_bs + offs_n[None, :] * stride_bn + offs_r[:, None],
                mask=present & n_ok[None, :] & (offs_r[:, None] < R),
                other=0.0,
            )  # [BLOCK_R, BLOCK_N]: B[slot].T
            h_slot = tl.where(rows[:, None], h, 0.0).to(b.dtype)
            acc += tl.dot(h_slot, b, input_precision=DOT_PRECISION)
        tl.store(y_ptrs, (y.to(tl.float32) + acc).to(y.dtype), mask=mask)


@triton.jit
def silu_mul_lora_shrink_kernel(
    gu_ptr, out_ptr, a_ptr, parts_ptr, slots_ptr,
    inter, R, K_PER_PART,
    stride_gu, stride_o, stride_as, stride_ar, stride_pp, stride_pt,
    gp_ptr, gb_ptr, G_NUM_PARTS, stride_gpp, stride_gpt, stride_gbs, stride_gbn,
    BLOCK_R: tl.constexpr, BLOCK_K: tl.constexpr,
    GU_EXPAND: tl.constexpr = False, BLOCK_GP: tl.constexpr = 1,
):  # fmt: skip
    """``silu(gate) * up`` of a merged ``[gate | up]`` row (the roundings of
    ``silu_mul_merged_kernel``) and, on the way, the shrink of that output for the next
    projection (down): program (t, p) stores its part of the activation and its partial
    product ``parts[p, t, :R]`` (zeros for a slot -1 token), so the down projection's
    adapter needs no launch of its own before the GEMV that expands it.

    ``GU_EXPAND``: ``gate_up`` still lacks its own adapter's delta (the gate/up GEMV only
    wrote its shrink's parts ``gp [P, T, 2R]``, slices gate then up): each program adds
    ``B[slot] @ h`` to its gate and up columns first, rounded as the separate expand
    rounds, so the gate/up adapter costs no launch and no GEMV epilogue."""
    t = tl.program_id(0)
    part = tl.program_id(1)
    offs_r = tl.arange(0, BLOCK_R)
    slot = tl.load(slots_ptr + t)
    has_adapter = slot >= 0
    a_base = a_ptr + tl.maximum(slot, 0).to(tl.int64) * stride_as
    k_start = part * K_PER_PART
    k_end = tl.minimum(k_start + K_PER_PART, inter)
    dt = gu_ptr.dtype.element_ty
    if GU_EXPAND:  # the gate and up slices of this row's h, the parts summed
        offs_gp = tl.arange(0, BLOCK_GP)
        h_rows = gp_ptr + offs_gp[:, None] * stride_gpp + t * stride_gpt + offs_r[None, :]
        h_ok = (offs_gp[:, None] < G_NUM_PARTS) & (offs_r[None, :] < R) & has_adapter
        h_gate = tl.sum(tl.load(h_rows, mask=h_ok, other=0.0), axis=0)
        h_up = tl.sum(tl.load(h_rows + R, mask=h_ok, other=0.0), axis=0)
        gb_base = gb_ptr + tl.maximum(slot, 0).to(tl.int64) * stride_gbs
    acc = tl.zeros((BLOCK_R, BLOCK_K), dtype=tl.float32)
    for k0 in range(k_start, k_end, BLOCK_K):
        offs_k = k0 + tl.arange(0, BLOCK_K)
        mask_k = offs_k < k_end
        g = tl.load(gu_ptr + t * stride_gu + offs_k, mask=mask_k, other=0.0).to(tl.float32)
        u = tl.load(gu_ptr + t * stride_gu + inter + offs_k, mask=mask_k, other=0.0)
        if GU_EXPAND:
            b_ok = mask_k[:, None] & (offs_r[None, :] < R) & has_adapter
            b_rows = gb_base + offs_k[:, None] * stride_gbn + offs_r[None, :]
            b_gate = tl.load(b_rows, mask=b_ok, other=0.0).to(tl.float32)
            b_up = tl.load(b_rows + inter * stride_gbn, mask=b_ok, other=0.0).to(tl.float32)
            g = (g + tl.sum(b_gate * h_gate[None, :], axis=1)).to(dt).to(tl.float32)
            u = (u.to(tl.float32) + tl.sum(b_up * h_up[None, :], axis=1)).to(dt)
        act = silu_mul(g, u.to(tl.float32)).to(out_ptr.dtype.element_ty)
        tl.store(out_ptr + t * stride_o + offs_k, act, mask=mask_k)
        a = tl.load(
            a_base + offs_r[:, None] * stride_ar + offs_k[None, :],
            mask=(offs_r[:, None] < R) & mask_k[None, :] & has_adapter,
            other=0.0,
        ).to(tl.float32)
        acc += a * act.to(tl.float32)[None, :]
    tl.store(parts_ptr + part * stride_pp + t * stride_pt + offs_r, tl.sum(acc, 1), mask=offs_r < R)
