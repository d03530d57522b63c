# mypy: disable-error-code="no-untyped-def,untyped-decorator"
"""Row GEMV for one (to ``ROWS_MAX_TOKENS``) decode token on the tiled AWQ layout: the
launch shape of the SDK's bf16 row GEMV (:mod:`engine_sdk.layers.gemv`) reading a quarter
of its bytes, with the add+RMSNorm prologue and the gated SiLU epilogue, so an AWQ decode
step has as many launches as a bf16 one (on rows the method fuses the norm into:
``engine_awq.method.ROWS_FUSE_NORM_MAX_K``)::

    program p:  output columns n = p * BLOCK_N .. +BLOCK_N, the whole of K
                (no split-K parts, no counters, no reduction)

    one loop step = BLOCK_C chunks of K (BLOCK_K = BLOCK_C * CHUNK activations):
      words  [BLOCK_N, BLOCK_C, W]        W consecutive int32 of each row per chunk
      per nibble i: codes [BLOCK_N, BLOCK_C, W], word j's nibble i = k = c * CHUNK + i * W
                    + j, and x at those k (loaded in the words' shape: no layout change)
      per group slice: zeros, scales [BLOCK_N, BLOCK_C, 1]

(:mod:`engine_awq.tiled` for the layout: a nibble slice never straddles a group.) The
arithmetic is the split-K GEMV's (:mod:`engine_awq.gemv`): ``q - z`` exact from one fused
multiply-add on the nibble's bits, ``x (q - z)`` summed over a group slice, the scale
applied once per slice, float32 throughout. Measured on an H100 (W2, 2026-12-06,
docs/quantization.md "Round 14 measured"): AWQ at batch 1 0.95x bf16's time on the
Qwen3-0.6B shape (the split-K GEMV 1.26x), 3.815 against 4.189 ms a token on the
Llama-3.1-8B shape.

Variants (one kernel):

- ``NORM``: the input is ``rms_norm(x + r) * nw`` with the roundings of the decoder's
  add+norm kernel; every program computes the row's norm itself (a row is a few KB read
  from L2) and program 0 stores the new residual ``x + r``.
- ``GATED`` (with ``NORM``): the layer is the merged ``[gate | up]`` of ``2 * N`` columns;
  a program dequantizes its gate columns ``n`` and the up columns ``N + n`` and stores
  ``silu(gate) * up``, each rounded to the dtype first (the decoder's SiLU kernel): the
  MLP's first half is one launch.

Tiles (:class:`RowsTile`: columns a program, activations a step, warps, pipeline stages):
the measured one for this GPU, launch and shape (``engine_awq/tuned/<device>.json``, kernel
``awq_rows_<plain|norm|gated>_c<chunk>``, written by ``benchmarks/rows_gemv_gpu.py
--write-tuned``), else ``ROWS_BLOCK_N`` / ``ROWS_BLOCK_K`` columns and activations with
Triton's default warps and stages (``ENGINE_AWQ_ROWS_BLOCK_N`` / ``_BLOCK_K`` for sweeps).
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, NamedTuple

import torch
import triton
import triton.language as tl
from engine_sdk.layers.pdl import pdl_launch, pdl_prefetch_rows, pdl_start
from engine_sdk.layers.split_k import tuned_config

from engine_awq.gemv import MAGIC_2_23, _codes, nibbles_per_group
from engine_awq.method import ROWS_MAX_TOKENS, ROWS_NORM_MAX_K

if TYPE_CHECKING:
    from engine_awq.wide import WideTile

__all__ = [
    "NORM_MAX_K",
    "ROWS_BLOCK_K",
    "ROWS_BLOCK_N",
    "ROWS_MAX_TOKENS",
    "RowsTile",
    "awq_rows",
    "awq_rows_add_rms_norm",
    "rows_tile",
]

# ROWS_MAX_TOKENS (1 to this many rows) and NORM_MAX_K (the prologue reads a whole row
# in one tile) live in engine_awq.method, which routes by them without importing Triton
NORM_MAX_K = ROWS_NORM_MAX_K
ROWS_BLOCK_N = int(os.environ.get("ENGINE_AWQ_ROWS_BLOCK_N", "4"))
ROWS_BLOCK_K = int(os.environ.get("ENGINE_AWQ_ROWS_BLOCK_K", "2048"))
# a sweep's tile from the environment: every launch takes it, the GPU's table is not read
SWEEP_TILE = any(f"ENGINE_AWQ_ROWS_BLOCK_{x}" in os.environ for x in "NK")
# Pipeline stages of the row GEMV's K loop (its STAGES): >= 2 has Triton load the next
# steps' code words and activations (cp.async into shared memory) while this step's
# arithmetic runs; 0 keeps the plain loop, where they leave only after it. The launch's
# num_stages (RowsTile.num_stages) does not pipeline this loop (sm90 machine code: no
# cp.async at any num_stages). Off (ENGINE_AWQ_LOOP_STAGES): at 2 stages the table's tiles
# made W2 8B 5.5x slower on an H100 (round 19). The wide GEMV keeps its plain loop:
# pipelined, it spills (255 registers, 82 KB of shared memory at 2 stages: its activations
# are staged once a column).
LOOP_STAGES = int(os.environ.get("ENGINE_AWQ_LOOP_STAGES", "0"))


class RowsTile(NamedTuple):
    """One launch's tile: output columns a program, activations a K step (rounded to
    whole chunks, at most the row), warps and the launch's pipeline stages (None: Triton's
    default; they do not pipeline this kernel's loop), and the K loop's stages
    (``STAGES``; None: ``LOOP_STAGES``)."""

    block_n: int = ROWS_BLOCK_N
    block_k: int = ROWS_BLOCK_K
    num_warps: int | None = None
    num_stages: int | None = None
    loop_stages: int | None = None


def rows_tile(
    device: torch.device, launch: str, num_tokens: int, weight_rows: int, num_in: int, chunk: int
) -> RowsTile:
    """The tile for ``launch`` (``plain`` | ``norm`` | ``gated``) of ``num_tokens`` rows over
    a weight of ``weight_rows`` (the merged ``[gate | up]`` rows when gated) x ``num_in``: the
    GPU's measured one (the module docstring), else the default :class:`RowsTile`. The
    environment's ``ENGINE_AWQ_ROWS_BLOCK_N`` / ``_BLOCK_K``, when set at import
    (``SWEEP_TILE``, read once like the defaults they set), win over the table."""
    if SWEEP_TILE:
        return RowsTile()
    kernel = f"awq_rows_{launch}_c{chunk}"
    found = tuned_config("engine_awq", kernel, device, weight_rows, num_in, num_tokens)
    if found is None:
        return RowsTile()
    return RowsTile(**{k: v for k, v in found.items() if k in RowsTile._fields})


@triton.jit
def row_norms(x_ptr, r_ptr, res_ptr, M, K, eps, stride_xm, pid,
              BLOCK_M: tl.constexpr, NORM_K: tl.constexpr):  # fmt: skip
    """The add+RMSNorm prologue's per-row ``1 / rms`` [BLOCK_M] of ``x + r`` (the sum
    rounded to ``x``'s dtype, as the decoder's add+norm kernel); program 0 stores that sum,
    the new residual, into ``res`` (rows ``stride_xm`` apart, like ``x`` and ``r``)."""
    dt = x_ptr.dtype.element_ty
    offs_m = tl.arange(0, BLOCK_M)
    offs = offs_m[:, None] * stride_xm + tl.arange(0, NORM_K)[None, :]
    row_ok = (offs_m < M)[:, None] & (tl.arange(0, NORM_K) < K)[None, :]
    xv = tl.load(x_ptr + offs, mask=row_ok, other=0.0).to(tl.float32)
    rv = tl.load(r_ptr + offs, mask=row_ok, other=0.0).to(tl.float32)
    sv = (xv + rv).to(dt)
    tl.store(res_ptr + offs, sv, mask=row_ok & (pid == 0))
    s32 = sv.to(tl.float32)
    return tl.rsqrt(tl.sum(s32 * s32, axis=1) / K + eps)


@triton.jit
def normed(h, r, nw, inv, dt):
    """``rms_norm(x + r) * nw`` from the loaded ``x`` (``h``), ``r`` and ``nw`` (float32) and
    the row's ``inv``, with the add+norm kernel's roundings (the sum, the normalized value
    and the product each to ``dt``)."""
    h = ((h + r).to(dt).to(tl.float32) * inv).to(dt).to(tl.float32)
    return (h * nw).to(dt).to(tl.float32)


@triton.jit
def _products(
    words, hi, x_row, r_row, nw_ptr, z_ptr, s_ptr, cols, offs_c, ok, inv, stride_z,
    stride_s, magic, dt,
    GROUP: tl.constexpr, CHUNK: tl.constexpr, NPG: tl.constexpr, NORM: tl.constexpr,
):  # fmt: skip
    """``s * x (q - z)`` [BLOCK_N, BLOCK_C, W] of one token row over the step's codes
    (not yet summed; ``ok`` [BLOCK_N, BLOCK_C, 1] masks the weights and this row's
    activations): per group slice (``NPG`` nibbles of a chunk that share
    a group) the products of its nibbles, ``q - z`` exact from one fused multiply-add
    (:func:`engine_awq.gemv._codes`), then one multiply by the scale. Every operand is
    3-D (``cols`` [BLOCK_N, 1, 1], ``offs_c`` [1, BLOCK_C, 1]), so nothing changes layout.
    ``NORM``: the activations are ``rms_norm(x + r) * nw`` from the row's ``inv`` (1 /
    rms) with the add+norm kernel's roundings (the sum, the normalized value and the
    product each to ``dt``)."""
    W: tl.constexpr = CHUNK // 8
    # [BLOCK_N, BLOCK_C, W], the words' shape (each column's row repeated): the loads of
    # x then get the words' layout and the products need no layout conversion
    k_chunk = cols * 0 + offs_c * CHUNK + tl.arange(0, W)[None, None, :]
    out = tl.zeros(words.shape, dtype=tl.float32)
    for gs in tl.static_range(8 // NPG):
        group = (offs_c * CHUNK + gs * NPG * W) // GROUP  # [1, BLOCK_C, 1]
        z = tl.load(z_ptr + group * stride_z + cols, mask=ok, other=0).to(tl.float32)
        s = tl.load(s_ptr + group * stride_s + cols, mask=ok, other=0.0).to(tl.float32)
        prod = tl.zeros(words.shape, dtype=tl.float32)
        for i in tl.static_range(gs * NPG, gs * NPG + NPG):
            k = k_chunk + i * W
            h = tl.load(x_row + k, mask=ok, other=0.0).to(tl.float32)
            if NORM:
                r = tl.load(r_row + k, mask=ok, other=0.0).to(tl.float32)
                nw = tl.load(nw_ptr + k, mask=ok, other=0.0).to(tl.float32)
                h = normed(h, r, nw, inv, dt)
            prod += h * _codes(words, hi, z, i, magic)
        out += prod * s
    return out


@triton.jit
def _rows_step(
    acc, acc3, words, x_ptr, r_ptr, nw_ptr, z_ptr, s_ptr, cols, offs_c, ok, M, invs,
    stride_xm, stride_z, stride_s, magic, dt,
    GROUP: tl.constexpr, CHUNK: tl.constexpr, NPG: tl.constexpr, NORM: tl.constexpr,
    BLOCK_M: tl.constexpr,
):  # fmt: skip
    """One step for every token row: one row adds its products to ``acc3`` [BLOCK_N,
    BLOCK_C, W] (summed once after the loop); more rows sum theirs into ``acc``
    [BLOCK_M, BLOCK_N] each step."""
    hi = words >> 12
    offs_m = tl.arange(0, BLOCK_M)
    for m in tl.static_range(BLOCK_M):
        inv = tl.sum(tl.where(offs_m == m, invs, 0.0), 0)
        part = _products(
            words, hi, x_ptr + m * stride_xm, r_ptr + m * stride_xm, nw_ptr, z_ptr, s_ptr,
            cols, offs_c, ok & (m < M), inv, stride_z, stride_s, magic, dt, GROUP, CHUNK, NPG,
            NORM,
        )  # fmt: skip
        if BLOCK_M == 1:
            acc3 += part
        else:
            row = tl.sum(tl.sum(part, axis=2), axis=1)
            acc = tl.where(offs_m[:, None] == m, acc + row[None, :], acc)
    return acc, acc3


@triton.jit
def awq_rows_kernel(
    x_ptr, r_ptr, nw_ptr, qw_ptr, z_ptr, s_ptr, b_ptr, out_ptr, res_ptr,
    M, N, num_chunks, eps, stride_xm, stride_qw, stride_z, stride_s, stride_om, magic,
    GROUP: tl.constexpr, CHUNK: tl.constexpr, NPG: tl.constexpr, BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr, BLOCK_C: tl.constexpr, HAS_BIAS: tl.constexpr,
    NORM: tl.constexpr = False, NORM_K: tl.constexpr = 16, GATED: tl.constexpr = False,
    PDL: tl.constexpr = False, PREFETCH: tl.constexpr = False, STAGES: tl.constexpr = 0,
):  # fmt: skip
    """``out[m, n] = sum_k h[m, k] * (q[k, n] - z[g, n]) * s[g, n] (+ b[n])`` for this
    program's ``BLOCK_N`` columns, ``h = x`` or (``NORM``) the normalized ``x + r`` (``x``,
    ``r`` and the new residual ``res`` share the row stride ``stride_xm``); float32
    accumulation, one rounding to ``x``'s dtype at the store (see the module docstring
    for ``GATED``). ``STAGES`` >= 2: the K loop's loads pipelined (``LOOP_STAGES``)."""
    W: tl.constexpr = CHUNK // 8
    pid = tl.program_id(0)
    # the program's code words into L2 before the wait (engine_sdk.layers.pdl)
    pdl_prefetch_rows(qw_ptr, pid * BLOCK_N, N, stride_qw, num_chunks * W, BLOCK_N, BLOCK_C * W,
                      PREFETCH, GATED)  # fmt: skip
    pdl_start(PDL)
    dt = x_ptr.dtype.element_ty
    cols = pid * BLOCK_N + tl.arange(0, BLOCK_N)
    n_ok = cols < N
    offs_m = tl.arange(0, BLOCK_M)
    m_ok = offs_m < M
    invs = tl.zeros([BLOCK_M], dtype=tl.float32)
    if NORM:  # each row's 1 / rms; program 0 stores the new residual
        invs = row_norms(
            x_ptr, r_ptr, res_ptr, M, num_chunks * CHUNK, eps, stride_xm, pid, BLOCK_M, NORM_K
        )
    acc = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
    acc_u = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
    acc3 = tl.zeros([BLOCK_N, BLOCK_C, W], dtype=tl.float32)
    acc3_u = tl.zeros([BLOCK_N, BLOCK_C, W], dtype=tl.float32)
    cols3 = cols[:, None, None]
    n_ok3 = n_ok[:, None, None]
    words_at = cols3.to(tl.int64) * stride_qw + tl.arange(0, W)[None, None, :]
    for c0 in tl.range(0, num_chunks, BLOCK_C, num_stages=STAGES):
        offs_c = c0 + tl.arange(0, BLOCK_C)[None, :, None]  # [1, BLOCK_C, 1]
        ok = n_ok3 & (offs_c < num_chunks)  # [BLOCK_N, BLOCK_C, 1]
        words = tl.load(qw_ptr + words_at + offs_c * W, mask=ok, other=0)
        acc, acc3 = _rows_step(
            acc, acc3, words, x_ptr, r_ptr, nw_ptr, z_ptr, s_ptr, cols3, offs_c, ok, M, invs,
            stride_xm, stride_z, stride_s, magic, dt, GROUP, CHUNK, NPG, NORM, BLOCK_M,
        )  # fmt: skip
        if GATED:
            words = tl.load(qw_ptr + words_at + N * stride_qw + offs_c * W, mask=ok, other=0)
            acc_u, acc3_u = _rows_step(
                acc_u, acc3_u, words, x_ptr, r_ptr, nw_ptr, z_ptr, s_ptr, cols3 + N, offs_c,
                ok, M, invs, stride_xm, stride_z, stride_s, magic, dt, GROUP, CHUNK, NPG,
                NORM, BLOCK_M,
            )  # fmt: skip
    if BLOCK_M == 1:  # one row: the products are summed once, here
        acc = tl.sum(tl.sum(acc3, axis=2), axis=1)[None, :]
        acc_u = tl.sum(tl.sum(acc3_u, axis=2), axis=1)[None, :]
    if HAS_BIAS:
        acc += tl.load(b_ptr + cols, mask=n_ok, other=0.0).to(tl.float32)[None, :]
    if GATED:
        if HAS_BIAS:
            acc_u += tl.load(b_ptr + N + cols, mask=n_ok, other=0.0).to(tl.float32)[None, :]
        g = acc.to(dt).to(tl.float32)
        acc = g / (1.0 + tl.exp(-g)) * acc_u.to(dt).to(tl.float32)  # the SDK's silu_mul
    out_ptrs = out_ptr + offs_m[:, None] * stride_om + cols[None, :]
    tl.store(out_ptrs, acc.to(dt), mask=m_ok[:, None] & n_ok[None, :])


Weights = tuple[torch.Tensor, torch.Tensor, torch.Tensor, int, int]


def awq_rows(
    x: torch.Tensor,
    tiled_qweight: torch.Tensor,
    tiled_zeros: torch.Tensor,
    scales: torch.Tensor,
    group_size: int,
    chunk: int,
    bias: torch.Tensor | None = None,
    tile: RowsTile | WideTile | None = None,
) -> torch.Tensor:
    """``x`` [M, K] (1 <= M <= ``ROWS_MAX_TOKENS``; fp16/bf16, fp32 for tests) times the
    tiled AWQ weight -> [M, N] in ``x.dtype``, plus ``bias``; one launch."""
    weights = (tiled_qweight, tiled_zeros, scales, group_size, chunk)
    out, _ = _launch(x, None, None, 0.0, weights, bias, False, tile)
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
    tile: RowsTile | WideTile | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """:func:`awq_rows` of ``rms_norm(x + residual) * norm_weight`` and ``x + residual``
    (the new residual), K at most ``NORM_MAX_K``: the decoder's add+norm kernel, then
    :func:`awq_rows`, in one launch. ``gated``: the weight is a merged ``[gate | up]`` of
    ``2 * I`` columns and the output is ``silu(gate) * up`` [M, I]."""
    assert x.shape[1] <= NORM_MAX_K and residual.shape == x.shape and residual.stride(1) == 1
    weights = (tiled_qweight, tiled_zeros, scales, group_size, chunk)
    return _launch(x, residual, norm_weight, eps, weights, bias, gated, tile)


def _launch(
    x: torch.Tensor,
    residual: torch.Tensor | None,
    norm_weight: torch.Tensor | None,
    eps: float,
    weights: Weights,
    bias: torch.Tensor | None,
    gated: bool,
    tile: RowsTile | WideTile | None,
) -> tuple[torch.Tensor, torch.Tensor]:
    from engine_awq.wide import WideTile, awq_wide, takes_wide, wide_tile  # (imports rows)

    tiled_qweight, tiled_zeros, scales, group_size, chunk = weights
    num_tokens, num_in = x.shape
    num_out = tiled_qweight.shape[0] // 2 if gated else tiled_qweight.shape[0]
    assert 0 < num_tokens <= ROWS_MAX_TOKENS, f"the row GEMV takes 1 to {ROWS_MAX_TOKENS} rows"
    npg = nibbles_per_group(x, weights)
    assert not gated or (residual is not None and tiled_qweight.shape[0] % 2 == 0)
    norm = residual is not None
    if norm:  # x, the residual and the new residual share one row stride
        x, residual = x.contiguous(), residual.contiguous()
    launch = "gated" if gated else "norm" if norm else "plain"
    if tile is None and takes_wide(num_tokens, num_in, chunk):
        tile = wide_tile(x.device, launch, tiled_qweight.shape[0], num_in)
    if isinstance(tile, WideTile):
        return awq_wide(x, residual, norm_weight, eps, (*weights, npg), bias, gated, tile)
    if tile is None:
        tile = rows_tile(x.device, launch, num_tokens, tiled_qweight.shape[0], num_in, chunk)
    chunks = triton.next_power_of_2(num_in // chunk)
    block_c = max(1, min(tile.block_k // chunk, chunks))
    out = torch.empty(num_tokens, num_out, dtype=x.dtype, device=x.device)
    options = {"num_warps": tile.num_warps, "num_stages": tile.num_stages}
    new_residual = torch.empty_like(x) if norm else out
    awq_rows_kernel[(triton.cdiv(num_out, tile.block_n),)](
        x, residual if norm else x, norm_weight if norm_weight is not None else x,
        tiled_qweight, tiled_zeros, scales, bias if bias is not None else scales, out,
        new_residual, num_tokens, num_out, num_in // chunk, eps, x.stride(0),
        tiled_qweight.stride(0), tiled_zeros.stride(0), scales.stride(0), out.stride(0),
        MAGIC_2_23,
        GROUP=group_size, CHUNK=chunk, NPG=npg, BLOCK_M=triton.next_power_of_2(num_tokens),
        BLOCK_N=tile.block_n, BLOCK_C=block_c,
        HAS_BIAS=bias is not None, NORM=norm,
        NORM_K=triton.next_power_of_2(num_in) if norm else 16, GATED=gated,
        STAGES=LOOP_STAGES if tile.loop_stages is None else tile.loop_stages,
        **{k: v for k, v in options.items() if v is not None}, **pdl_launch(x, prefetch=True),
    )  # fmt: skip
    return out, new_residual
