# mypy: disable-error-code="no-untyped-def,untyped-decorator"
"""Row GEMV for one (to ``ROWS_MAX_TOKENS``) decode token on the tiled AWQ layout: the
launch shape of the SDK's bf16 row GEMV (:mod:`engine_sdk.layers.gemv`) reading a quarter
of its bytes, with the add+RMSNorm prologue and the gated SiLU epilogue, so an AWQ decode
step has as many launches as a bf16 one::

    program p:  output columns n = p * BLOCK_N .. +BLOCK_N, the whole of K
                (no split-K parts, no counters, no reduction)

    one loop step = BLOCK_C chunks of K (BLOCK_K = BLOCK_C * CHUNK activations):
      words  [BLOCK_N, BLOCK_C, W]        W consecutive int32 of each row per chunk
      codes  [BLOCK_N, BLOCK_C, 8, W]     nibble i of word j = k = c * CHUNK + i * W + j
      x      [BLOCK_C, 8, W]              the same k, one contiguous load
      zeros, scales [BLOCK_N, BLOCK_C, 8] the group of each (chunk, nibble) slice

(:mod:`engine_awq.tiled` for the layout: a nibble slice never straddles a group.) The
weight is dequantized once per step in float32, ``(q - z) * s``, and used for every token.

Variants (one kernel):

- ``NORM``: the input is ``rms_norm(x + r) * nw`` with the roundings of the decoder's
  add+norm kernel; every program computes the row's norm itself (a row is a few KB read
  from L2) and program 0 stores the new residual ``x + r``.
- ``GATED`` (with ``NORM``): the layer is the merged ``[gate | up]`` of ``2 * N`` columns;
  a program dequantizes its gate columns ``n`` and the up columns ``N + n`` and stores
  ``silu(gate) * up``, each rounded to the dtype first (the decoder's SiLU kernel): the
  MLP's first half is one launch.

``BLOCK_N`` / ``BLOCK_K`` default to ``ROWS_BLOCK_N`` / ``ROWS_BLOCK_K``
(``ENGINE_AWQ_ROWS_BLOCK_N`` / ``_BLOCK_K`` for sweeps).
"""

from __future__ import annotations

import os

import torch
import triton
import triton.language as tl

__all__ = [
    "NORM_MAX_K",
    "ROWS_BLOCK_K",
    "ROWS_BLOCK_N",
    "ROWS_MAX_TOKENS",
    "awq_rows",
    "awq_rows_add_rms_norm",
]

ROWS_MAX_TOKENS = 4  # the kernel takes 1 to this many rows (method.py picks when it runs)
NORM_MAX_K = 8192  # the prologue reads a whole row in one tile
ROWS_BLOCK_N = int(os.environ.get("ENGINE_AWQ_ROWS_BLOCK_N", "2"))
ROWS_BLOCK_K = int(os.environ.get("ENGINE_AWQ_ROWS_BLOCK_K", "1024"))


@triton.jit
def _dequant(qw_ptr, z_ptr, s_ptr, cols, c_ok, n_ok, offs_c, stride_qw, stride_z, stride_s,
             GROUP: tl.constexpr, CHUNK: tl.constexpr):  # fmt: skip
    """``(q - z) * s`` in float32 [BLOCK_N, BLOCK_C, 8, W] for columns ``cols`` and chunks
    ``offs_c`` (masked: 0)."""
    W: tl.constexpr = CHUNK // 8
    offs_i = tl.arange(0, 8)
    offs_j = tl.arange(0, W)
    ok = n_ok[:, None] & c_ok[None, :]  # [BLOCK_N, BLOCK_C]
    words = tl.load(
        qw_ptr + cols[:, None, None].to(tl.int64) * stride_qw + offs_c[None, :, None] * W
        + offs_j[None, None, :],
        mask=ok[:, :, None], other=0,
    )  # fmt: skip
    codes = (words[:, :, None, :] >> (4 * offs_i)[None, None, :, None]) & 0xF
    group = (offs_c[:, None] * CHUNK + offs_i[None, :] * W) // GROUP  # [BLOCK_C, 8]
    zs = group[None, :, :] * stride_z + cols[:, None, None]
    z = tl.load(z_ptr + zs, mask=ok[:, :, None], other=0).to(tl.int32)
    zs = group[None, :, :] * stride_s + cols[:, None, None]
    s = tl.load(s_ptr + zs, mask=ok[:, :, None], other=0.0).to(tl.float32)
    return (codes - z[:, :, :, None]).to(tl.float32) * s[:, :, :, None]


@triton.jit
def _normed(x, r_ptr, nw_ptr, k, ok, m, stride_rm, inv, dt):
    """``rms_norm(x + r) * nw`` at ``k`` given the row's ``inv`` (1 / rms), with the
    add+norm kernel's roundings: the sum, the normalized value and the product each to
    ``dt``."""
    r = tl.load(r_ptr + m * stride_rm + k, mask=ok, other=0.0).to(tl.float32)
    nw = tl.load(nw_ptr + k, mask=ok, other=0.0).to(tl.float32)
    s = (x + r).to(dt).to(tl.float32)
    return ((s * inv).to(dt).to(tl.float32) * nw).to(dt).to(tl.float32)


@triton.jit
def awq_rows_kernel(
    x_ptr, r_ptr, nw_ptr, qw_ptr, z_ptr, s_ptr, b_ptr, out_ptr, res_ptr,
    M, N, num_chunks, eps,
    stride_xm, stride_rm, stride_qw, stride_z, stride_s, stride_om, stride_sm,
    GROUP: tl.constexpr, CHUNK: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
    BLOCK_C: tl.constexpr, HAS_BIAS: tl.constexpr, NORM: tl.constexpr = False,
    NORM_K: tl.constexpr = 16, GATED: tl.constexpr = False,
):  # fmt: skip
    """``out[m, n] = sum_k h[m, k] * (q[k, n] - z[g, n]) * s[g, n] (+ b[n])`` for this
    program's ``BLOCK_N`` columns, ``h = x`` or (``NORM``) the normalized ``x + r``;
    float32 accumulation, one rounding to ``x``'s dtype at the store (see the module
    docstring for ``GATED``)."""
    W: tl.constexpr = CHUNK // 8
    dt = x_ptr.dtype.element_ty
    pid = tl.program_id(0)
    cols = pid * BLOCK_N + tl.arange(0, BLOCK_N)
    n_ok = cols < N
    offs_m = tl.arange(0, BLOCK_M)
    K = num_chunks * CHUNK
    invs = tl.zeros([BLOCK_M], dtype=tl.float32)
    if NORM:  # each row's 1 / rms; program 0 stores the new residual
        offs = tl.arange(0, NORM_K)
        for m in tl.static_range(BLOCK_M):
            row_ok = (offs < K) & (m < M)
            xv = tl.load(x_ptr + m * stride_xm + offs, mask=row_ok, other=0.0).to(tl.float32)
            rv = tl.load(r_ptr + m * stride_rm + offs, mask=row_ok, other=0.0).to(tl.float32)
            sv = (xv + rv).to(dt)
            tl.store(res_ptr + m * stride_sm + offs, sv, mask=row_ok & (pid == 0))
            s32 = sv.to(tl.float32)
            invs = tl.where(offs_m == m, tl.rsqrt(tl.sum(s32 * s32, 0) / K + eps), invs)
    acc = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
    acc_u = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
    k_tile = (
        tl.arange(0, BLOCK_C)[:, None, None] * CHUNK
        + tl.arange(0, 8)[None, :, None] * W
        + tl.arange(0, W)[None, None, :]
    )  # [BLOCK_C, 8, W]: the activations of the step's codes
    for c0 in range(0, num_chunks, BLOCK_C):
        offs_c = c0 + tl.arange(0, BLOCK_C)
        c_ok = offs_c < num_chunks
        w = _dequant(qw_ptr, z_ptr, s_ptr, cols, c_ok, n_ok, offs_c, stride_qw, stride_z,
                     stride_s, GROUP, CHUNK)  # fmt: skip
        if GATED:
            wu = _dequant(qw_ptr, z_ptr, s_ptr, cols + N, c_ok, n_ok, offs_c, stride_qw,
                          stride_z, stride_s, GROUP, CHUNK)  # fmt: skip
        k = c0 * CHUNK + k_tile
        k_ok = c_ok[:, None, None]
        for m in tl.static_range(BLOCK_M):
            ok = k_ok & (m < M)
            h = tl.load(x_ptr + m * stride_xm + k, mask=ok, other=0.0).to(tl.float32)
            if NORM:
                inv = tl.sum(tl.where(offs_m == m, invs, 0.0), 0)
                h = _normed(h, r_ptr, nw_ptr, k, ok, m, stride_rm, inv, dt)
            part = tl.sum(tl.sum(tl.sum(w * h[None, :, :, :], axis=3), axis=2), axis=1)
            acc = tl.where(offs_m[:, None] == m, acc + part[None, :], acc)
            if GATED:
                part = tl.sum(tl.sum(tl.sum(wu * h[None, :, :, :], axis=3), axis=2), axis=1)
                acc_u = tl.where(offs_m[:, None] == m, acc_u + part[None, :], acc_u)
    if HAS_BIAS:
        acc += tl.load(b_ptr + cols, mask=n_ok, other=0.0).to(tl.float32)[None, :]
    if GATED:
        if HAS_BIAS:
            acc_u += tl.load(b_ptr + N + cols, mask=n_ok, other=0.0).to(tl.float32)[None, :]
        g = acc.to(dt).to(tl.float32)
        acc = g / (1.0 + tl.exp(-g)) * acc_u.to(dt).to(tl.float32)  # the SDK's silu_mul
    out_ptrs = out_ptr + offs_m[:, None] * stride_om + cols[None, :]
    tl.store(out_ptrs, acc.to(dt), mask=(offs_m[:, None] < M) & n_ok[None, :])


Weights = tuple[torch.Tensor, torch.Tensor, torch.Tensor, int, int]


def awq_rows(
    x: torch.Tensor,
    tiled_qweight: torch.Tensor,
    tiled_zeros: torch.Tensor,
    scales: torch.Tensor,
    group_size: int,
    chunk: int,
    bias: torch.Tensor | None = None,
    block_n: int | None = None,
    block_k: int | None = None,
) -> torch.Tensor:
    """``x`` [M, K] (1 <= M <= ``ROWS_MAX_TOKENS``; fp16/bf16, fp32 for tests) times the
    tiled AWQ weight -> [M, N] in ``x.dtype``, plus ``bias``; one launch."""
    weights = (tiled_qweight, tiled_zeros, scales, group_size, chunk)
    out, _ = _launch(x, None, None, 0.0, weights, bias, False, block_n, block_k)
    return out


def awq_rows_add_rms_norm(
    x: torch.Tensor,
    residual: torch.Tensor,
    norm_weight: torch.Tensor,
    eps: float,
    tiled_qweight: torch.Tensor,
    tiled_zeros: torch.Tensor,
    scales: torch.Tensor,
    group_size: int,
    chunk: int,
    bias: torch.Tensor | None = None,
    gated: bool = False,
    block_n: int | None = None,
    block_k: int | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """:func:`awq_rows` of ``rms_norm(x + residual) * norm_weight`` and ``x + residual``
    (the new residual), K at most ``NORM_MAX_K``: the decoder's add+norm kernel, then
    :func:`awq_rows`, in one launch. ``gated``: the weight is a merged ``[gate | up]`` of
    ``2 * I`` columns and the output is ``silu(gate) * up`` [M, I]."""
    assert x.shape[1] <= NORM_MAX_K and residual.shape == x.shape and residual.stride(1) == 1
    weights = (tiled_qweight, tiled_zeros, scales, group_size, chunk)
    return _launch(x, residual, norm_weight, eps, weights, bias, gated, block_n, block_k)


def _launch(
    x: torch.Tensor,
    residual: torch.Tensor | None,
    norm_weight: torch.Tensor | None,
    eps: float,
    weights: Weights,
    bias: torch.Tensor | None,
    gated: bool,
    block_n: int | None,
    block_k: int | None,
) -> tuple[torch.Tensor, torch.Tensor]:
    tiled_qweight, tiled_zeros, scales, group_size, chunk = weights
    num_tokens, num_in = x.shape
    num_out = tiled_qweight.shape[0] // 2 if gated else tiled_qweight.shape[0]
    assert 0 < num_tokens <= ROWS_MAX_TOKENS, f"the row GEMV takes 1 to {ROWS_MAX_TOKENS} rows"
    assert tiled_qweight.shape[1] * 8 == num_in and num_in % chunk == 0
    assert tiled_qweight.stride(1) == tiled_zeros.stride(1) == scales.stride(1) == 1
    assert x.stride(1) == 1 and group_size % (chunk // 8) == 0
    assert not gated or (residual is not None and tiled_qweight.shape[0] % 2 == 0)
    block_n = block_n or ROWS_BLOCK_N
    chunks = triton.next_power_of_2(num_in // chunk)
    block_c = max(1, min((block_k or ROWS_BLOCK_K) // chunk, chunks))
    out = torch.empty(num_tokens, num_out, dtype=x.dtype, device=x.device)
    norm = residual is not None
    new_residual = torch.empty_like(x) if norm else out
    r = residual if residual is not None else x
    nw = norm_weight if norm_weight is not None else x
    awq_rows_kernel[(triton.cdiv(num_out, block_n),)](
        x, r, nw, tiled_qweight, tiled_zeros, scales, bias if bias is not None else scales,
        out, new_residual, num_tokens, num_out, num_in // chunk, eps,
        x.stride(0), r.stride(0), tiled_qweight.stride(0), tiled_zeros.stride(0),
        scales.stride(0), out.stride(0), new_residual.stride(0),
        GROUP=group_size, CHUNK=chunk, BLOCK_M=triton.next_power_of_2(num_tokens),
        BLOCK_N=block_n, BLOCK_C=block_c, HAS_BIAS=bias is not None, NORM=norm,
        NORM_K=triton.next_power_of_2(num_in) if norm else 16, GATED=gated,
        num_warps=4 if block_n * block_c * chunk <= 4096 else 8,
    )  # fmt: skip
    return out, new_residual
