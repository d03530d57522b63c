# mypy: disable-error-code="no-untyped-def,untyped-decorator"
"""One-token GEMV on the tiled AWQ layout for long rows (K >= ``WIDE_MIN_K``): the row
GEMV's launches (:mod:`engine_awq.rows`: plain, add+RMSNorm prologue, gated SiLU epilogue)
with a tile laid out so that every thread holds the same activations for ``BLOCK_N``
columns, and the codes turned into products in two instructions a weight::

    one loop step: BLOCK_C chunks (BLOCK_K = BLOCK_C * CHUNK activations) of BLOCK_N columns
      words  [BLOCK_C, W, BLOCK_N]    a thread: W / 2 words of one chunk, every column
      x      [BLOCK_C, W, BLOCK_N]    loaded once a thread, shared by its columns (and by the
                                      gate and up columns of the gated launch)

The row GEMV's tile ``[BLOCK_N, BLOCK_C, W]`` gives each thread one column (Triton spreads
the threads over the columns first), so each activation is loaded, converted and, with the
prologue, normalized once per column; here the columns are the last axis, which Triton
keeps in registers, so that work is done once per ``BLOCK_N`` columns.

The arithmetic, per group slice of a chunk (``NPG`` nibbles sharing a zero point and a
scale), float32 throughout::

    sum_k h_k (q_k - z)  =  2^61 * sum_k (h_k 2^(88-e)) * sub(q_k 2^e)  -  z * sum_k h_k

``sub(q 2^e)`` is the masked nibble read as a float32: the subnormal ``q 2^(e-149)``
(``e = 4i``, or ``4 (i - 3)`` for nibbles above 4, read from ``words >> 12``), so a weight
costs one ``LOP3`` (the mask) and one ``FFMA`` (the product, exact: 8 by 4 significant
bits, a normal result for ``2^-65 <= |h| < 2^40``); the activation's scaling by ``2^(88-e)``
and its running sum ``sum h`` are paid once a thread for all its columns. The slice ends
with ``s (P - z H)`` per column (``2^61`` folded into ``s``, ``2^-61`` into ``z``). The
summation order differs from the row GEMV's (``q - z`` per weight), so results agree to
float32 rounding, not bit for bit. Measured in sm90 machine code
(``benchmarks/quant_gemv_sass.py``): 3.1 instructions a weight at 8 columns, against 5.9
for the row GEMV.

Tiles (:class:`WideTile`): columns a program, activations a step (a power of two of whole
chunks; the warps follow: a warp covers 2048 activations of 128-row chunks); the measured
one for this GPU and launch (``engine_awq/tuned/<device>.json``, kernel
``awq_wide_<plain|norm|gated>_c<chunk>``), else 8 columns (4 gate and 4 up columns when
gated) over 4096 activations. ``ENGINE_AWQ_WIDE_MIN_K`` sets the shortest row that takes
it (default 4096: the Llama-3.1-8B shape's projections, not the Qwen3-0.6B shape's; 0:
never). The norm and gated launches run only where the method fuses the norm into a
one-token GEMV, rows of at most ``engine_awq.method.ROWS_FUSE_NORM_MAX_K`` (default 2048,
below this GEMV's rows): by default the wide GEMV takes the plain launches alone.
"""

from __future__ import annotations

import os
from typing import NamedTuple

import torch
import triton
import triton.language as tl
from engine_sdk.layers.pdl import pdl_launch, pdl_prefetch_rows, pdl_start
from engine_sdk.layers.split_k import tuned_config

from engine_awq.rows import normed, row_norms

__all__ = ["WIDE_MIN_K", "WideTile", "awq_wide", "takes_wide", "wide_tile"]

WIDE_MIN_K = int(os.environ.get("ENGINE_AWQ_WIDE_MIN_K", "4096"))
WIDE_WORDS_PER_THREAD = 8  # the layout's words a thread along W (two 16-byte loads)


class WideTile(NamedTuple):
    """Columns a program (the gate columns when gated) and activations a step."""

    block_n: int = 8
    block_k: int = 4096


def takes_wide(num_tokens: int, num_in: int, chunk: int) -> bool:
    """Whether a ``num_tokens`` x ``num_in`` call with ``chunk``-row chunks may take this
    GEMV: one token, rows of at least ``WIDE_MIN_K`` (0: never), 128-row chunks (16 words,
    two threads a chunk)."""
    return num_tokens == 1 and 0 < WIDE_MIN_K <= num_in and chunk == 128


def wide_tile(device: torch.device, launch: str, weight_rows: int, num_in: int) -> WideTile | None:
    """The tile for ``launch`` (``plain`` | ``norm`` | ``gated``): the GPU's measured one,
    else the default for the plain and norm launches; None for a gated launch without a
    measured row (the row GEMV's, which the sweep found faster there unless the table
    says otherwise: the module docstring)."""
    found = tuned_config("engine_awq", f"awq_wide_{launch}_c128", device, weight_rows, num_in, 1)
    if found is not None:
        return WideTile(**{k: v for k, v in found.items() if k in WideTile._fields})
    return {"plain": WideTile(), "norm": WideTile(4, 2048)}.get(launch)


@triton.jit
def _subnormal(words, hi, i: tl.constexpr):
    """Nibble ``i`` of ``words`` masked in place, read as the float32 ``q 2^(e-149)``."""
    if i < 5:
        bits = words & (0xF << (4 * i))
    else:
        bits = hi & (0xF << (4 * (i - 3)))
    return bits.to(tl.float32, bitcast=True)


@triton.jit
def _close(acc, prod, hsum, z_ptr, s_ptr, group, cols, ok, stride_z, stride_s):
    """``acc + s (2^61 prod - z hsum)`` for the slice's zero points and scales."""
    z = tl.load(z_ptr + group * stride_z + cols, mask=ok, other=0).to(tl.float32)
    s = tl.load(s_ptr + group * stride_s + cols, mask=ok, other=0.0).to(tl.float32)
    return acc + tl.sum((s * (2.0**61)) * (prod - (z * (2.0**-61)) * hsum), axis=1, keep_dims=True)


@triton.jit
def _slice(acc, acc_u, words, hi, words_u, hi_u, x_row, r_row, nw_ptr, z_ptr, s_ptr, cols, N,
           k_chunk, offs_c, ok, inv, stride_z, stride_s, dt, gs: tl.constexpr,
           GROUP: tl.constexpr, CHUNK: tl.constexpr, NPG: tl.constexpr, NORM: tl.constexpr,
           GATED: tl.constexpr):  # fmt: skip
    """Group slice ``gs`` of the step's chunks: ``acc`` (and the up columns' ``acc_u``) +=
    ``s (q - z) h`` summed over its nibbles (the module docstring); every operand is in
    the words' shape [BLOCK_C, W, BLOCK_N] or broadcasts to it."""
    W: tl.constexpr = CHUNK // 8
    prod = tl.zeros(words.shape, dtype=tl.float32)
    prod_u = tl.zeros(words.shape, dtype=tl.float32)
    hsum = tl.zeros(words.shape, dtype=tl.float32)
    for i in tl.static_range(gs * NPG, gs * NPG + NPG):
        k = k_chunk + i * W
        h = tl.load(x_row + k).to(tl.float32)
        if NORM:
            r = tl.load(r_row + k).to(tl.float32)
            h = normed(h, r, tl.load(nw_ptr + k).to(tl.float32), inv, dt)
        hsum += h
        h = h * (2.0 ** (88 - 4 * i + 12 * (i // 5)))  # 2^(88 - e)
        prod += h * _subnormal(words, hi, i)
        if GATED:
            prod_u += h * _subnormal(words_u, hi_u, i)
    group = (offs_c * CHUNK + gs * NPG * W) // GROUP  # [BLOCK_C, 1, 1]
    acc = _close(acc, prod, hsum, z_ptr, s_ptr, group, cols, ok, stride_z, stride_s)
    if GATED:
        acc_u = _close(acc_u, prod_u, hsum, z_ptr, s_ptr, group, cols + N, ok, stride_z, stride_s)
    return acc, acc_u


@triton.jit
def awq_wide_kernel(
    x_ptr, r_ptr, nw_ptr, qw_ptr, z_ptr, s_ptr, b_ptr, out_ptr, res_ptr,
    N, num_chunks, eps, stride_qw, stride_z, stride_s,
    GROUP: tl.constexpr, CHUNK: tl.constexpr, NPG: tl.constexpr, BLOCK_N: tl.constexpr,
    BLOCK_C: tl.constexpr, HAS_BIAS: tl.constexpr,
    NORM: tl.constexpr = False, NORM_K: tl.constexpr = 16, GATED: tl.constexpr = False,
    PDL: tl.constexpr = False, PREFETCH: tl.constexpr = False,
):  # fmt: skip
    """``out[n] = sum_k h[k] (q[k, n] - z[g, n]) s[g, n] (+ b[n])`` for one token and this
    program's ``BLOCK_N`` columns, ``h = x`` or (``NORM``) the normalized ``x + r`` (program 0
    stores the new residual ``x + r`` into ``res``); ``GATED``: the weight is ``[gate | up]``
    of ``2 N`` columns and ``out = silu(gate) * up``, as the row GEMV's launches."""
    W: tl.constexpr = CHUNK // 8
    pid = tl.program_id(0)
    # the program's code words into L2 before the wait (engine_sdk.layers.pdl)
    pdl_prefetch_rows(qw_ptr, pid * BLOCK_N, N, stride_qw, num_chunks * W, BLOCK_N, BLOCK_C * W,
                      PREFETCH, GATED)  # fmt: skip
    pdl_start(PDL)
    dt = x_ptr.dtype.element_ty
    cols = pid * BLOCK_N + tl.arange(0, BLOCK_N)
    n_ok = cols < N
    inv = 0.0
    if NORM:
        inv = tl.sum(
            row_norms(x_ptr, r_ptr, res_ptr, 1, num_chunks * CHUNK, eps, 0, pid, 1, NORM_K), 0
        )
    cols3 = cols[None, None, :]
    n_ok3 = n_ok[None, None, :]
    offs_w = tl.arange(0, W)[None, :, None]
    words_at = cols3.to(tl.int64) * stride_qw + offs_w
    # the activations' offsets in the words' shape (each column's repeated): a thread loads
    # its chunk's activations once and every column it holds reads them
    k_at = cols3 * 0 + offs_w
    acc = tl.zeros([BLOCK_C, 1, BLOCK_N], dtype=tl.float32)
    acc_u = tl.zeros([BLOCK_C, 1, BLOCK_N], dtype=tl.float32)
    for c0 in range(0, num_chunks, BLOCK_C):
        offs_c = (c0 + tl.arange(0, BLOCK_C))[:, None, None]  # [BLOCK_C, 1, 1]
        ok = (offs_c < num_chunks) & n_ok3
        # past the row, the last chunk's activations: unmasked loads stay one load a thread
        # for all its columns, and those chunks' words, zero points and scales read as 0
        k_step = k_at + tl.minimum(offs_c, num_chunks - 1) * CHUNK
        words = tl.load(qw_ptr + words_at + offs_c * W, mask=ok, other=0)
        words_u = words
        if GATED:
            words_u = tl.load(qw_ptr + words_at + N * stride_qw + offs_c * W, mask=ok, other=0)
        for gs in tl.static_range(8 // NPG):
            acc, acc_u = _slice(
                acc, acc_u, words, words >> 12, words_u, words_u >> 12, x_ptr, r_ptr, nw_ptr,
                z_ptr, s_ptr, cols3, N, k_step, offs_c, ok, inv,
                stride_z, stride_s, dt, gs, GROUP, CHUNK, NPG, NORM, GATED,
            )  # fmt: skip
    out = tl.sum(tl.sum(acc, axis=1), axis=0)
    if HAS_BIAS:
        out += tl.load(b_ptr + cols, mask=n_ok, other=0.0).to(tl.float32)
    if GATED:
        up = tl.sum(tl.sum(acc_u, axis=1), axis=0)
        if HAS_BIAS:
            up += tl.load(b_ptr + N + cols, mask=n_ok, other=0.0).to(tl.float32)
        g = out.to(dt).to(tl.float32)
        out = g / (1.0 + tl.exp(-g)) * up.to(dt).to(tl.float32)  # the SDK's silu_mul
    tl.store(out_ptr + cols, out.to(dt), mask=n_ok)


def awq_wide(
    x: torch.Tensor,
    residual: torch.Tensor | None,
    norm_weight: torch.Tensor | None,
    eps: float,
    weights: tuple[torch.Tensor, torch.Tensor, torch.Tensor, int, int, int],
    bias: torch.Tensor | None,
    gated: bool,
    tile: WideTile,
) -> tuple[torch.Tensor, torch.Tensor]:
    """One launch for ``x`` [1, K] with ``tile``, as :func:`engine_awq.rows._launch`:
    ``(out, new_residual)``, the new residual ``x + residual`` when ``residual`` is given
    (else ``out`` again); ``weights`` is ``(tiled_qweight, tiled_zeros, scales, group_size,
    chunk, npg)``."""
    tiled_qweight, tiled_zeros, scales, group_size, chunk, npg = weights
    num_in = x.shape[1]
    num_out = tiled_qweight.shape[0] // 2 if gated else tiled_qweight.shape[0]
    norm = residual is not None
    assert x.shape[0] == 1, "the wide GEMV takes one token"
    chunks = num_in // chunk
    block_c = max(1, min(tile.block_k // chunk, triton.next_power_of_2(chunks)))
    # a warp covers 32 threads x 8 words; fewer chunks than that leave threads on columns
    warps = max(1, block_c * (chunk // 8) // (32 * WIDE_WORDS_PER_THREAD))
    out = torch.empty(1, num_out, dtype=x.dtype, device=x.device)
    new_residual = torch.empty_like(x) if norm else out
    awq_wide_kernel[(triton.cdiv(num_out, tile.block_n),)](
        x, residual if norm else x, norm_weight if norm_weight is not None else x,
        tiled_qweight, tiled_zeros, scales, bias if bias is not None else scales, out,
        new_residual, num_out, chunks, eps, tiled_qweight.stride(0), tiled_zeros.stride(0),
        scales.stride(0),
        GROUP=group_size, CHUNK=chunk, NPG=npg, BLOCK_N=tile.block_n, BLOCK_C=block_c,
        HAS_BIAS=bias is not None, NORM=norm,
        NORM_K=triton.next_power_of_2(num_in) if norm else 16, GATED=gated, num_warps=warps,
        **pdl_launch(x, prefetch=True),
    )  # fmt: skip
    return out, new_residual
