# mypy: disable-error-code="no-untyped-def,untyped-decorator"
"""Triton kernel behind ``gemv`` (imported only when the GEMV path runs)."""

from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def gemv_kernel(
    x_ptr,
    w_ptr,
    b_ptr,
    out_ptr,
    M,
    N,
    K,
    stride_xm,
    stride_wn,
    stride_om,
    HAS_BIAS: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    SILU_MUL: tl.constexpr = False,
):
    """``out[m, n] = sum_k x[m, k] * w[n, k] (+ b[n])`` for ``BLOCK_N`` weight rows per
    program: each weight tile is loaded once and used by all ``M <= BLOCK_M`` rows of
    ``x``; float32 accumulation, one rounding at the store.

    ``SILU_MUL``: ``x`` rows are ``[gate | up]`` (``2 * K`` wide, a merged gate/up
    projection's output) and the kernel's input is ``silu(gate) * up``, computed and
    rounded to ``x``'s dtype exactly as ``silu_mul_merged_kernel`` does (so the result
    equals that kernel followed by this one, with one launch and no hidden tensor)."""
    offs_n = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_m = tl.arange(0, BLOCK_M)
    offs_k = tl.arange(0, BLOCK_K)
    n_ok = offs_n < N
    acc = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
    w_rows = w_ptr + offs_n[:, None].to(tl.int64) * stride_wn
    for k0 in range(0, K, BLOCK_K):
        k_ok = (k0 + offs_k) < K
        w = tl.load(w_rows + (k0 + offs_k)[None, :], mask=n_ok[:, None] & k_ok[None, :], other=0.0)
        w = w.to(tl.float32)
        for m in tl.static_range(BLOCK_M):
            x_row = x_ptr + m * stride_xm + k0 + offs_k
            if SILU_MUL:
                g = tl.load(x_row, mask=k_ok & (m < M), other=0.0).to(tl.float32)
                u = tl.load(x_row + K, mask=k_ok & (m < M), other=0.0).to(tl.float32)
                x = (g / (1.0 + tl.exp(-g)) * u).to(x_ptr.dtype.element_ty)
            else:
                x = tl.load(x_row, mask=k_ok & (m < M), other=0.0)
            part = tl.sum(w * x.to(tl.float32)[None, :], axis=1)
            acc = tl.where(offs_m[:, None] == m, acc + part[None, :], acc)
    if HAS_BIAS:
        acc += tl.load(b_ptr + offs_n, mask=n_ok, other=0.0).to(tl.float32)[None, :]
    out_ptrs = out_ptr + offs_m[:, None] * stride_om + offs_n[None, :]
    tl.store(
        out_ptrs,
        acc.to(out_ptr.dtype.element_ty),
        mask=(offs_m[:, None] < M) & n_ok[None, :],
    )
