# mypy: disable-error-code="no-untyped-def,untyped-decorator"
"""Triton kernel behind ``gemv`` (imported only when the GEMV path runs)."""

from __future__ import annotations

import triton
import triton.language as tl

from engine_sdk.layers._fused_kernels import silu_mul
from engine_sdk.layers.pdl import pdl_prefetch_rows, pdl_start


@triton.jit
def gemv_kernel(
    x_ptr,
    w_ptr,
    b_ptr,
    s_ptr,
    out_ptr,
    M,
    N,
    K,
    stride_xm,
    stride_wn,
    stride_om,
    lp_ptr, lb_ptr, slots_ptr, starts_ptr,
    R, NUM_PARTS, stride_lpp, stride_lpt, stride_lbs, stride_lbn,
    la_ptr, flag_ptr, NUM_SHRINK, NUM_RB, K_PER_PART, stride_las, stride_lar,
    HAS_BIAS: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    LORA: tl.constexpr = False,
    NUM_SLICES: tl.constexpr = 1,
    BLOCK_R: tl.constexpr = 16,
    BLOCK_P: tl.constexpr = 1,
    SHRINK: tl.constexpr = False,
    SHRINK_K: tl.constexpr = 256,
    SCALE: tl.constexpr = 0,
    PDL: tl.constexpr = False,
    PREFETCH: tl.constexpr = False,
    STAGES: tl.constexpr = 0,
):  # fmt: skip
    """``out[m, n] = sum_k x[m, k] * w[n, k] (+ b[n])`` for ``BLOCK_N`` weight rows per
    program: each weight tile is loaded once and used by all ``M <= BLOCK_M`` rows of
    ``x``; float32 accumulation, one rounding (to ``x``'s dtype) at the store. ``SCALE``
    (a float8 ``w``): the float32 sum times the tensor's scale ``s[0]`` (1) or each
    column's ``s[n]`` (2) before the bias. With ``LORA`` the epilogue
    adds each row's adapter delta (``_lora_delta``); with ``SHRINK`` the first
    ``NUM_SHRINK`` programs compute the shrink those epilogues read (``_shrink_program``).
    ``PREFETCH`` (with ``PDL``): the program's weight rows are asked of L2 before the wait.
    ``STAGES`` >= 2: Triton pipelines the K loop's loads (cp.async into shared memory,
    ``STAGES - 1`` steps ahead of the arithmetic); 0 keeps the plain loop, whose next loads
    leave only after this step's arithmetic (the launch's ``num_stages`` does not pipeline
    it)."""
    pid = tl.program_id(0)
    if not SHRINK:
        pdl_prefetch_rows(w_ptr, pid * BLOCK_N, N, stride_wn, K, BLOCK_N, BLOCK_K, PREFETCH)
    pdl_start(PDL)
    if SHRINK:
        if pid < NUM_SHRINK:
            _shrink_program(
                pid, x_ptr, x_ptr, x_ptr, 0.0, out_ptr, M, K, stride_xm, 0,
                la_ptr, lp_ptr, slots_ptr, flag_ptr, NUM_SLICES * R, NUM_RB, K_PER_PART,
                stride_las, stride_lar, stride_lpp, stride_lpt, BLOCK_M, False, 16, SHRINK_K,
            )  # fmt: skip
            return
        pid -= NUM_SHRINK
    offs_n = pid * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_m = tl.arange(0, BLOCK_M)
    offs_k = tl.arange(0, BLOCK_K)
    n_ok = offs_n < N
    acc = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
    w_rows = w_ptr + offs_n[:, None].to(tl.int64) * stride_wn
    for k0 in tl.range(0, K, BLOCK_K, num_stages=STAGES):
        k_ok = (k0 + offs_k) < K
        w = tl.load(w_rows + (k0 + offs_k)[None, :], mask=n_ok[:, None] & k_ok[None, :], other=0.0)
        w = w.to(tl.float32)
        for m in tl.static_range(BLOCK_M):
            x = tl.load(x_ptr + m * stride_xm + k0 + offs_k, mask=k_ok & (m < M), other=0.0)
            part = tl.sum(w * x.to(tl.float32)[None, :], axis=1)
            acc = tl.where(offs_m[:, None] == m, acc + part[None, :], acc)
    acc = _weight_scale(acc, s_ptr, offs_n, n_ok, SCALE)
    if LORA:
        if SHRINK:  # the parts come from this launch's shrink programs
            _wait_for_shrink(flag_ptr, NUM_SHRINK)
        acc = _lora_delta(
            acc, offs_m, offs_n, n_ok, M, lp_ptr, lb_ptr, slots_ptr, starts_ptr,
            R, NUM_PARTS, stride_lpp, stride_lpt, stride_lbs, stride_lbn,
            BLOCK_M, BLOCK_N, NUM_SLICES, BLOCK_R, BLOCK_P, ".cg" if SHRINK else "",
        )  # fmt: skip
    _store_rows(
        acc, b_ptr, out_ptr, offs_m, offs_n, n_ok, M, stride_om, HAS_BIAS, x_ptr.dtype.element_ty
    )  # fmt: skip
    if SHRINK:
        _finish_shrink(flag_ptr, tl.cdiv(N, BLOCK_N))


@triton.jit
def gemv_add_rms_norm_kernel(
    x_ptr, r_ptr, nw_ptr, w_ptr, b_ptr, s_ptr, out_ptr, res_ptr,
    M, N, K, eps,
    stride_xm, stride_rm, stride_wn, stride_om, stride_sm,
    lp_ptr, lb_ptr, slots_ptr, starts_ptr,
    R, NUM_PARTS, stride_lpp, stride_lpt, stride_lbs, stride_lbn,
    la_ptr, flag_ptr, NUM_SHRINK, NUM_RB, K_PER_PART, stride_las, stride_lar,
    HAS_BIAS: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr, LORA: tl.constexpr = False, NUM_SLICES: tl.constexpr = 1,
    BLOCK_R: tl.constexpr = 16, BLOCK_P: tl.constexpr = 1, SHRINK: tl.constexpr = False,
    SHRINK_K: tl.constexpr = 256, GATED: tl.constexpr = False, SCALE: tl.constexpr = 0,
    PDL: tl.constexpr = False, PREFETCH: tl.constexpr = False,
):  # fmt: skip
    """``gemv_kernel`` over ``rms_norm(x + r) * nw`` for a whole row in one tile
    (``K <= BLOCK_K``): each program forms the sum and its norm itself (a row is a few KB,
    read from L2) and program 0 stores the sum, the new residual. The roundings are those
    of ``add_rms_norm_kernel``: the sum to the dtype, the normalized value to the dtype,
    then times the weight, rounded. ``SHRINK``: as in ``gemv_kernel``, over the
    normalized rows; ``SHRINK`` without ``LORA``: the shrink programs only write the parts
    (no signal, no epilogue: a later kernel adds the expand, see
    ``LoRALayer.deferred_add_rms_norm``). ``GATED`` (no LoRA): ``w`` is a merged
    ``[gate | up]`` of ``2 * N``
    rows; a program reads gate rows ``n`` and up rows ``N + n`` and stores
    ``silu(gate) * up`` (the roundings of the GEMV then ``silu_mul_merged_kernel``).
    ``SCALE``: a float8 ``w`` with scales as in ``gemv_kernel`` (gated: ``s[N + n]`` for
    the up rows). ``PREFETCH``: as in ``gemv_kernel``."""
    pid = tl.program_id(0)
    if not SHRINK:
        pdl_prefetch_rows(w_ptr, pid * BLOCK_N, N, stride_wn, K, BLOCK_N, BLOCK_K, PREFETCH, GATED)
    pdl_start(PDL)
    if SHRINK:
        if pid < NUM_SHRINK:
            _shrink_program(
                pid, x_ptr, r_ptr, nw_ptr, eps, out_ptr, M, K, stride_xm, stride_rm,
                la_ptr, lp_ptr, slots_ptr, flag_ptr, NUM_SLICES * R, NUM_RB, K_PER_PART,
                stride_las, stride_lar, stride_lpp, stride_lpt, BLOCK_M, True, BLOCK_K, SHRINK_K,
                LORA,
            )  # fmt: skip
            return
        pid -= NUM_SHRINK
    offs_n = pid * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_m = tl.arange(0, BLOCK_M)
    offs_k = tl.arange(0, BLOCK_K)
    n_ok = offs_n < N
    k_ok = offs_k < K
    w_tile = w_ptr + offs_n[:, None].to(tl.int64) * stride_wn + offs_k[None, :]
    w_ok = n_ok[:, None] & k_ok[None, :]
    w = tl.load(w_tile, mask=w_ok, other=0.0).to(tl.float32)
    wu = w
    if GATED:
        u_rows = (offs_n + N)[:, None].to(tl.int64) * stride_wn
        wu = tl.load(w_ptr + u_rows + offs_k[None, :], mask=w_ok, other=0.0).to(tl.float32)
    nw = tl.load(nw_ptr + offs_k, mask=k_ok, other=0.0).to(tl.float32)
    acc = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
    acc_u = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
    for m in tl.static_range(BLOCK_M):
        row_ok = k_ok & (m < M)
        x = tl.load(x_ptr + m * stride_xm + offs_k, mask=row_ok, other=0.0).to(tl.float32)
        r = tl.load(r_ptr + m * stride_rm + offs_k, mask=row_ok, other=0.0).to(tl.float32)
        s = (x + r).to(res_ptr.dtype.element_ty)
        tl.store(res_ptr + m * stride_sm + offs_k, s, mask=row_ok & (pid == 0))
        s32 = s.to(tl.float32)
        var = tl.sum(s32 * s32, 0) / K
        y = (s32 * tl.rsqrt(var + eps)).to(out_ptr.dtype.element_ty).to(tl.float32)
        h = (y * nw).to(out_ptr.dtype.element_ty).to(tl.float32)
        part = tl.sum(w * h[None, :], axis=1)
        acc = tl.where(offs_m[:, None] == m, acc + part[None, :], acc)
        if GATED:
            part_u = tl.sum(wu * h[None, :], axis=1)
            acc_u = tl.where(offs_m[:, None] == m, acc_u + part_u[None, :], acc_u)
    acc = _weight_scale(acc, s_ptr, offs_n, n_ok, SCALE)
    if GATED:
        acc_u = _weight_scale(acc_u, s_ptr, offs_n + N, n_ok, SCALE)
        _store_gated(acc, acc_u, b_ptr, out_ptr, offs_m, offs_n, n_ok, M, N, stride_om, HAS_BIAS)
        return
    if LORA:
        if SHRINK:  # the parts come from this launch's shrink programs
            _wait_for_shrink(flag_ptr, NUM_SHRINK)
        acc = _lora_delta(
            acc, offs_m, offs_n, n_ok, M, lp_ptr, lb_ptr, slots_ptr, starts_ptr,
            R, NUM_PARTS, stride_lpp, stride_lpt, stride_lbs, stride_lbn,
            BLOCK_M, BLOCK_N, NUM_SLICES, BLOCK_R, BLOCK_P, ".cg" if SHRINK else "",
        )  # fmt: skip
    _store_rows(
        acc, b_ptr, out_ptr, offs_m, offs_n, n_ok, M, stride_om, HAS_BIAS, x_ptr.dtype.element_ty
    )  # fmt: skip
    if SHRINK and LORA:
        _finish_shrink(flag_ptr, tl.cdiv(N, BLOCK_N))


@triton.jit
def _weight_scale(acc, s_ptr, offs_n, n_ok, SCALE: tl.constexpr):
    """A float8 weight's float32 sum times its scale: none (0), the tensor's ``s[0]``
    (1) or each column's ``s[n]`` (2)."""
    if SCALE == 1:
        acc = acc * tl.load(s_ptr)
    elif SCALE == 2:
        acc = acc * tl.load(s_ptr + offs_n, mask=n_ok, other=0.0)[None, :]
    return acc


@triton.jit
def _store_gated(
    acc, acc_u, b_ptr, out_ptr, offs_m, offs_n, n_ok, M, N, stride_om, HAS_BIAS: tl.constexpr
):  # fmt: skip
    """The gated epilogue: gate and up each get their bias and their rounding to the
    dtype (the merged GEMV's store), then ``silu(gate) * up`` in float32, rounded once."""
    dt = out_ptr.dtype.element_ty
    if HAS_BIAS:
        acc += tl.load(b_ptr + offs_n, mask=n_ok, other=0.0).to(tl.float32)[None, :]
        acc_u += tl.load(b_ptr + N + offs_n, mask=n_ok, other=0.0).to(tl.float32)[None, :]
    act = silu_mul(acc.to(dt).to(tl.float32), acc_u.to(dt).to(tl.float32))
    out_ptrs = out_ptr + offs_m[:, None] * stride_om + offs_n[None, :]
    tl.store(out_ptrs, act.to(dt), mask=(offs_m[:, None] < M) & n_ok[None, :])


@triton.jit
def _lora_delta(
    acc, offs_m, offs_n, n_ok, M, lp_ptr, lb_ptr, slots_ptr, starts_ptr,
    R, NUM_PARTS, stride_lpp, stride_lpt, stride_lbs, stride_lbn,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, NUM_SLICES: tl.constexpr,
    BLOCK_R: tl.constexpr, BLOCK_P: tl.constexpr, CACHE: tl.constexpr = "",
):  # fmt: skip
    """``acc[m, n] += h[m, slice(n)] @ B[slot_m, n, :R]``: the LoRA expand of this
    program's columns, in float32 before the one rounding. ``h`` is the sum of the
    shrink's parts ``lp [P, M, S*R]`` (the slice's rank block); a row whose slot is -1
    adds nothing (its loads are masked off). Each column finds its slice from the slice
    starts ``[S + 1]`` (a column tile may straddle two slices).

    Each slice's parts are one ``[BLOCK_P, BLOCK_M, BLOCK_R]`` load and one sum, and the
    rows' ``B`` rows one ``[BLOCK_M, BLOCK_N, BLOCK_R]`` load, independent of each other:
    no wait for L2 per part or per row. (Issuing these loads before the weight loop was
    timed in round 11 and changed nothing: the epilogue's cost is its work.)"""
    offs_r = tl.arange(0, BLOCK_R)
    offs_p = tl.arange(0, BLOCK_P)
    r_ok = offs_r < R
    s = offs_n * 0
    for i in tl.static_range(1, NUM_SLICES):
        s += (offs_n >= tl.load(starts_ptr + i)).to(s.dtype)
    slots = tl.load(slots_ptr + offs_m, mask=offs_m < M, other=-1)  # [BLOCK_M]
    on = slots >= 0
    rows = (
        lp_ptr
        + offs_p[:, None, None] * stride_lpp
        + offs_m[None, :, None] * stride_lpt
        + offs_r[None, None, :]
    )
    p_ok = (offs_p[:, None, None] < NUM_PARTS) & on[None, :, None] & r_ok[None, None, :]
    h = tl.zeros((BLOCK_M, BLOCK_N, BLOCK_R), dtype=tl.float32)
    for i in tl.static_range(NUM_SLICES):
        hs = tl.sum(tl.load(rows + i * R, mask=p_ok, other=0.0, cache_modifier=CACHE), axis=0)
        h = tl.where((s == i)[None, :, None], hs[:, None, :], h)
    b = tl.load(
        lb_ptr
        + tl.maximum(slots, 0).to(tl.int64)[:, None, None] * stride_lbs
        + offs_n[None, :, None] * stride_lbn
        + offs_r[None, None, :],
        mask=on[:, None, None] & n_ok[None, :, None] & r_ok[None, None, :],
        other=0.0,
    ).to(tl.float32)
    return acc + tl.sum(h * b, axis=2)


@triton.jit
def _shrink_program(
    q, x_ptr, r_ptr, nw_ptr, eps, out_ptr, M, K, stride_xm, stride_rm,
    la_ptr, lp_ptr, slots_ptr, flag_ptr, RS, NUM_RB, K_PER_PART,
    stride_las, stride_lar, stride_lpp, stride_lpt,
    BLOCK_M: tl.constexpr, NORM: tl.constexpr, ROW_K: tl.constexpr, SHRINK_K: tl.constexpr,
    SIGNAL: tl.constexpr = True,
):  # fmt: skip
    """Shrink program ``q`` of a GEMV launch: rank rows ``16 * (q % NUM_RB) ..`` of each
    row's adapter ``A [slot, RS, K]`` over part ``q // NUM_RB`` of K (``K_PER_PART``) into
    ``lp [P, M, RS]`` (zeros for rows without an adapter), then (``SIGNAL``) one arrival on
    ``flag_ptr[0]`` (release) that the GEMV programs wait for (``_wait_for_shrink``);
    without it a later launch reads the parts (the expand outside this GEMV).
    With ``NORM`` the input is ``rms_norm(x + r) * nw`` with the fused GEMV's roundings
    (the row's sum of squares from one ``ROW_K`` load)."""
    dt = out_ptr.dtype.element_ty
    rb = q % NUM_RB
    part = q // NUM_RB
    offs_r = rb * 16 + tl.arange(0, 16)
    r_ok = offs_r < RS
    k_start = part * K_PER_PART
    k_end = tl.minimum(k_start + K_PER_PART, K)
    for m in tl.static_range(BLOCK_M):
        slot = tl.load(slots_ptr + m, mask=m < M, other=-1)
        use = (slot >= 0) & (m < M)
        inv = 0.0
        if NORM:
            offs_row = tl.arange(0, ROW_K)
            row_ok = (offs_row < K) & use
            x_row = tl.load(x_ptr + m * stride_xm + offs_row, mask=row_ok, other=0.0)
            r_row = tl.load(r_ptr + m * stride_rm + offs_row, mask=row_ok, other=0.0)
            s_row = (x_row.to(tl.float32) + r_row.to(tl.float32)).to(dt).to(tl.float32)
            inv = tl.rsqrt(tl.sum(s_row * s_row, 0) / K + eps)
        a_base = la_ptr + tl.maximum(slot, 0).to(tl.int64) * stride_las
        acc = tl.zeros((16, SHRINK_K), dtype=tl.float32)
        for k0 in range(k_start, k_end, SHRINK_K):
            offs_k = k0 + tl.arange(0, SHRINK_K)
            k_ok = (offs_k < k_end) & use
            h = tl.load(x_ptr + m * stride_xm + offs_k, mask=k_ok, other=0.0).to(tl.float32)
            if NORM:
                rv = tl.load(r_ptr + m * stride_rm + offs_k, mask=k_ok, other=0.0)
                sv = (h + rv.to(tl.float32)).to(dt).to(tl.float32)
                nv = tl.load(nw_ptr + offs_k, mask=k_ok, other=0.0).to(tl.float32)
                h = ((sv * inv).to(dt).to(tl.float32) * nv).to(dt).to(tl.float32)
            a = tl.load(
                a_base + offs_r[:, None] * stride_lar + offs_k[None, :],
                mask=r_ok[:, None] & k_ok[None, :],
                other=0.0,
            ).to(tl.float32)
            acc += a * h[None, :]
        tl.store(
            lp_ptr + part * stride_lpp + m * stride_lpt + offs_r, tl.sum(acc, 1),
            mask=r_ok & (m < M),
        )  # fmt: skip
    if SIGNAL:  # every thread's part is written before one thread announces it (release)
        tl.debug_barrier()
        tl.atomic_add(flag_ptr, 1, sem="release", scope="gpu")


@triton.jit
def _wait_for_shrink(flag_ptr, NUM_SHRINK):
    """Spin until the launch's ``NUM_SHRINK`` shrink programs have all arrived (acquire).
    They are the lowest program ids, dispatched before any GEMV program that waits, and
    wait for nothing themselves, so the wait ends (the forward-progress assumption of
    split-K semaphores and stream-K GEMMs)."""
    arrived = tl.atomic_add(flag_ptr, 0, sem="acquire", scope="gpu")
    while arrived < NUM_SHRINK:
        arrived = tl.atomic_add(flag_ptr, 0, sem="acquire", scope="gpu")


@triton.jit
def _finish_shrink(flag_ptr, NUM_TILES):
    """The last GEMV program of the launch (``flag_ptr[1]`` counts them; every one has
    passed its wait) puts both counters back to zero for the next launch or graph replay."""
    done = tl.atomic_add(flag_ptr + 1, 1, sem="acq_rel", scope="gpu")
    if done == NUM_TILES - 1:
        tl.atomic_xchg(flag_ptr, 0, sem="relaxed", scope="gpu")
        tl.atomic_xchg(flag_ptr + 1, 0, sem="relaxed", scope="gpu")


@triton.jit
def _store_rows(
    acc, b_ptr, out_ptr, offs_m, offs_n, n_ok, M, stride_om, HAS_BIAS: tl.constexpr, ROUND_DTYPE
):  # fmt: skip
    """Both GEMVs' epilogue: add the bias (float32), round once to ``ROUND_DTYPE``, the
    activations' (and a bf16/fp16 weight's) dtype (a float32 output, as the LM head's
    logits, holds that rounded value: the library GEMM then ``.float()``), store the
    valid rows."""
    if HAS_BIAS:
        acc += tl.load(b_ptr + offs_n, mask=n_ok, other=0.0).to(tl.float32)[None, :]
    out_ptrs = out_ptr + offs_m[:, None] * stride_om + offs_n[None, :]
    tl.store(
        out_ptrs,
        acc.to(ROUND_DTYPE).to(out_ptr.dtype.element_ty),
        mask=(offs_m[:, None] < M) & n_ok[None, :],
    )
