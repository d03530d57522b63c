# mypy: disable-error-code="no-untyped-def,untyped-decorator"
"""Split-K W4A16 GEMV for decode batches (1 to ``MAX_TOKENS`` tokens) on the tiled AWQ
layout, in one Triton launch.

``out [M, N] = x [M, K] @ W [K, N]`` with ``W = (q - z) * s``, the 4-bit codes read from
``tiled_qweight`` [N, K/8] (:mod:`engine_awq.tiled`: chunks of ``CHUNK`` K rows, ``W =
CHUNK / 8`` words a row, nibble ``i`` of word ``j`` is ``k = c * CHUNK + i * W + j``)::

    grid (cdiv(N, BLOCK_N), S)   program (t, s): columns [t * BLOCK_N, +BLOCK_N) and the
                                 K chunks [s * P, (s + 1) * P), P = chunks_per_split

    one loop step = one chunk: a [BLOCK_N, W] tile of words (W consecutive int32 of each
    row, 64 bytes at CHUNK 128); Triton pipelines the loop's loads (cp.async into shared
    memory, ``NUM_STAGES - 1`` chunks ahead of the arithmetic)

The ``S`` parts of a column tile meet in the same launch
(:func:`engine_sdk.layers.split_k.store_split_k`: the last program of the tile adds them
in a fixed order), so a projection is one kernel, which a CUDA graph replays without a
memset. K is split until about ``GEMV_PROGRAMS_PER_SM`` programs per multiprocessor run.

Dequantization in registers, no int->float conversion: ``(word & 0xF << 4i) | 0x4B000000``
read as float32 is ``bits = 2^23 + q 2^e`` (:func:`engine_awq.w4a16.nibble_bits`, ``e`` a
multiple of 4), and one fused multiply-add gives ``q - z`` exactly::

    bits * 2^-e - (2^(23-e) + z)  =  q - z          (a small integer: no rounding)

The scale multiplies once per group slice (``NPG`` nibbles of a chunk that share a
group): ``acc += s * sum_k x[k] (q[k] - z)``. Variants (``GemvConfig.variant``):

- ``fma``: CUDA cores, ``BLOCK_M`` = the tokens rounded up to a power of two; one token
  keeps a [BLOCK_N, W] product tile (each thread several rows, so an activation is
  converted once for all of them).
- ``dot``: tensor cores, weight first (``out^T [BLOCK_N, 16] = (q - z)^T @ x^T``, the
  16-row side of the instruction holds the tokens): per nibble one ``K = 16`` dot of the
  codes (exact in fp16/bf16) with the 16 activations they meet. Needs CHUNK 128.
"""

from __future__ import annotations

import math
from typing import NamedTuple

import torch
import triton
import triton.language as tl
from engine_sdk.layers.pdl import pdl_launch, pdl_start
from engine_sdk.layers.split_k import (
    NormArgs,
    norm_args,
    norm_launch_args,
    norm_rows_into,
    plan_split_k,
    store_split_k_tile,
    tuned_config,
)

from engine_awq.w4a16 import nibble_bits

__all__ = [
    "GEMV_PROGRAMS_PER_SM",
    "MAX_TOKENS",
    "GemvConfig",
    "awq_gemv",
    "awq_gemv_add_rms_norm",
    "default_gemv_config",
    "gemv_config",
]

MAX_TOKENS = 16  # rows the GEMV takes (the dot variant's 16-row side)
GEMV_PROGRAMS_PER_SM = 2  # split K until about this many programs per multiprocessor
MAGIC_2_23 = 0x4B000000  # the bits of float32 2^23 (see engine_awq.w4a16.nibble_bits)


class GemvConfig(NamedTuple):
    """Tile shape and launch options of one GEMV call."""

    variant: str  # "fma" or "dot"
    block_n: int
    num_warps: int = 4
    num_stages: int = 4  # chunks in flight per program (Triton's pipelined loads)
    split: int | None = None  # None: about GEMV_PROGRAMS_PER_SM programs per multiprocessor


@triton.jit
def _codes(words, hi, z, i: tl.constexpr, magic):
    """``q - z`` of nibble ``i`` as exact float32: ``bits * 2^-e - (2^(23-e) + z)`` with
    ``bits = 2^23 + q 2^e`` (:func:`engine_awq.w4a16.nibble_bits`) and ``z`` the rows' zero
    points ([BLOCK_N, 1]); one fused multiply-add, exact because the result is a small
    integer."""
    e: tl.constexpr = 4 * i - 12 * (i // 5)
    return nibble_bits(words, hi, i, magic) * (1.0 / (1 << e)) - (z + (1 << (23 - e)))


@triton.jit
def _load_group(z_ptrs, s_ptrs, g, stride_z, stride_s, mask_n):
    """Zero points [BLOCK_N, 1] and scales [BLOCK_N] of group ``g``, float32."""
    z = tl.load(z_ptrs + g * stride_z, mask=mask_n, other=0).to(tl.float32)[:, None]
    s = tl.load(s_ptrs + g * stride_s, mask=mask_n, other=0.0).to(tl.float32)
    return z, s


@triton.jit
def _fma1_chunk(acc, x_ptr, k0, words, z_ptrs, s_ptrs, stride_z, stride_s, mask_n, magic,
                GROUP: tl.constexpr, W: tl.constexpr, NPG: tl.constexpr):  # fmt: skip
    """One chunk on CUDA cores, one token: ``acc`` [BLOCK_N] += the chunk's products.
    ``words`` [BLOCK_N, W]; ``x_ptr + k0`` the chunk's first activation."""
    hi = words >> 12
    offs_j = tl.arange(0, W)
    for gs in tl.static_range(8 // NPG):  # group slices of the chunk
        z, s = _load_group(z_ptrs, s_ptrs, (k0 + gs * NPG * W) // GROUP, stride_z, stride_s,
                           mask_n)  # fmt: skip
        prod = tl.zeros((words.shape[0], W), dtype=tl.float32)
        for i in tl.static_range(gs * NPG, gs * NPG + NPG):
            x = tl.load(x_ptr + k0 + i * W + offs_j).to(tl.float32)
            prod += x[None, :] * _codes(words, hi, z, i, magic)
        acc += s * tl.sum(prod, axis=1)
    return acc


@triton.jit
def _fma_chunk(acc, x_rows, mask_m, k0, words, z_ptrs, s_ptrs, stride_z, stride_s, mask_n,
               magic, GROUP: tl.constexpr, W: tl.constexpr, NPG: tl.constexpr):  # fmt: skip
    """One chunk on CUDA cores, several tokens: ``acc`` [BLOCK_M, BLOCK_N] += the chunk's
    products; ``x_rows`` [BLOCK_M, 1] row pointers."""
    hi = words >> 12
    offs_j = tl.arange(0, W)
    for gs in tl.static_range(8 // NPG):
        z, s = _load_group(z_ptrs, s_ptrs, (k0 + gs * NPG * W) // GROUP, stride_z, stride_s,
                           mask_n)  # fmt: skip
        prod = tl.zeros((acc.shape[0], words.shape[0], W), dtype=tl.float32)
        for i in tl.static_range(gs * NPG, gs * NPG + NPG):
            x = tl.load(x_rows + k0 + i * W + offs_j[None, :], mask=mask_m[:, None], other=0.0)
            codes = _codes(words, hi, z, i, magic)
            prod += x.to(tl.float32)[:, None, :] * codes[None, :, :]
        acc += s[None, :] * tl.sum(prod, axis=2)
    return acc


@triton.jit
def _dot_chunk(acc, xt_ptrs, mask_m, k0, words, z_ptrs, s_ptrs, stride_z, stride_s, mask_n,
               magic, GROUP: tl.constexpr, W: tl.constexpr, NPG: tl.constexpr):  # fmt: skip
    """One chunk on tensor cores: ``acc`` [BLOCK_N, 16] += s * (q - z)^T @ x^T per group
    slice, one ``K = W = 16`` dot per nibble; ``xt_ptrs`` [W, 16]. The codes ``q - z`` are
    small integers, exact in fp16 and bf16; the scale is applied once per slice."""
    hi = words >> 12
    for gs in tl.static_range(8 // NPG):
        z, s = _load_group(z_ptrs, s_ptrs, (k0 + gs * NPG * W) // GROUP, stride_z, stride_s,
                           mask_n)  # fmt: skip
        part = tl.zeros(acc.shape, dtype=tl.float32)
        for i in tl.static_range(gs * NPG, gs * NPG + NPG):
            xt = tl.load(xt_ptrs + k0 + i * W, mask=mask_m[None, :], other=0.0)
            codes = _codes(words, hi, z, i, magic)
            part = tl.dot(codes.to(xt.dtype), xt, part)
        acc += s[:, None] * part
    return acc


@triton.jit
def _gemv_kernel(
    x_ptr,
    qw_ptr,
    z_ptr,
    s_ptr,
    bias_ptr,
    out_ptr,
    part_ptr,
    lock_ptr,
    M,
    N,
    num_chunks,
    chunks_per_split,
    num_splits,
    stride_xm,
    stride_qw,
    stride_z,
    stride_s,
    stride_om,
    magic,
    r_ptr,
    nw_ptr,
    xn_ptr,
    res_ptr,
    eps,
    stride_rm,
    GROUP: tl.constexpr,
    CHUNK: tl.constexpr,
    NPG: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    NUM_STAGES: tl.constexpr,
    USE_DOT: tl.constexpr,
    HAS_BIAS: tl.constexpr,
    SPLIT: tl.constexpr,
    NORM: tl.constexpr,
    NORM_M: tl.constexpr,
    NORM_BLOCK: tl.constexpr,
    PDL: tl.constexpr = False,
):
    pdl_start(PDL)
    W: tl.constexpr = CHUNK // 8
    pid_n = tl.program_id(0)
    pid_s = tl.program_id(1)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_m = tl.arange(0, BLOCK_M)
    offs_j = tl.arange(0, W)
    mask_n = offs_n < N
    mask_m = offs_m < M
    c_begin = pid_s * chunks_per_split
    c_end = tl.minimum(c_begin + chunks_per_split, num_chunks)
    if NORM:  # x := rms_norm(x + r) * nw over this program's chunks (split_k.norm_rows_into)
        norm_rows_into(
            x_ptr, r_ptr, nw_ptr, xn_ptr, res_ptr, M, num_chunks * CHUNK, eps, c_begin * CHUNK,
            c_end * CHUNK, stride_xm, stride_rm, pid_n == 0, NORM_M, NORM_BLOCK,
        )  # fmt: skip
        x_ptr = xn_ptr
        stride_xm = num_chunks * CHUNK
    qw_rows = qw_ptr + offs_n[:, None] * stride_qw + offs_j[None, :]  # [BLOCK_N, W]
    z_ptrs = z_ptr + offs_n
    s_ptrs = s_ptr + offs_n
    if USE_DOT:
        acc = tl.zeros((BLOCK_N, BLOCK_M), dtype=tl.float32)  # out^T
        xt_ptrs = x_ptr + offs_j[:, None] + offs_m[None, :] * stride_xm  # [W, BLOCK_M]
    elif BLOCK_M == 1:
        acc1 = tl.zeros((BLOCK_N,), dtype=tl.float32)
    else:
        acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
        x_rows = x_ptr + offs_m[:, None] * stride_xm
    # Triton pipelines the loads of this loop (cp.async, NUM_STAGES - 1 chunks ahead).
    for c in tl.range(c_begin, c_end, num_stages=NUM_STAGES):
        words = tl.load(qw_rows + c * W, mask=mask_n[:, None], other=0)
        k0 = c * CHUNK
        if USE_DOT:
            acc = _dot_chunk(
                acc, xt_ptrs, mask_m, k0, words, z_ptrs, s_ptrs, stride_z, stride_s, mask_n,
                magic, GROUP, W, NPG,
            )  # fmt: skip
        elif BLOCK_M == 1:
            acc1 = _fma1_chunk(
                acc1, x_ptr, k0, words, z_ptrs, s_ptrs, stride_z, stride_s, mask_n, magic,
                GROUP, W, NPG,
            )  # fmt: skip
        else:
            acc = _fma_chunk(
                acc, x_rows, mask_m, k0, words, z_ptrs, s_ptrs, stride_z, stride_s, mask_n,
                magic, GROUP, W, NPG,
            )  # fmt: skip

    if not USE_DOT and BLOCK_M == 1:
        acc = acc1[None, :]
    store_split_k_tile(
        acc, out_ptr, part_ptr, bias_ptr, lock_ptr + pid_n, offs_m, offs_n, M, N, stride_om,
        pid_s, num_splits, USE_DOT, HAS_BIAS, SPLIT,
    )  # fmt: skip


def default_gemv_config(
    num_tokens: int, num_out: int, chunk: int, variant: str | None = None
) -> GemvConfig:
    """The tile for ``num_tokens`` rows (first guesses, to retune from
    ``benchmarks/quant_gemv_gpu.py``). ``variant`` None picks ``fma`` up to
    ``GEMV_FMA_MAX_TOKENS`` of :mod:`engine_awq.method` or when the chunk is not 128 (the
    dot's K step is one 16-word nibble slice), else ``dot``."""
    from engine_awq.method import GEMV_FMA_MAX_TOKENS

    if variant is None:
        variant = "fma" if chunk != 128 or num_tokens <= GEMV_FMA_MAX_TOKENS else "dot"
    if variant == "dot":  # 128 columns: fewer instructions a weight, if the layer is wide
        return GemvConfig("dot", 128 if num_out >= 4096 else 64)
    block_m = triton.next_power_of_2(num_tokens)
    # One token: 4 rows of W words a thread (x converted once for 4 rows). More: the
    # [BLOCK_M, BLOCK_N, W] product tile lives in registers.
    block_n = 128 if num_out >= 2048 else 64
    while block_m * block_n * (chunk // 8) > 4096 and block_n > 16:
        block_n //= 2
    return GemvConfig("fma", block_n)


def gemv_config(
    device: torch.device, num_tokens: int, num_out: int, num_in: int, chunk: int
) -> GemvConfig:
    """The tile a layer runs: the measured one for this GPU and shape
    (``engine_awq/tuned/<device>.json``, :func:`engine_sdk.layers.split_k.tuned_config`,
    kernel ``awq_c<chunk>``), else :func:`default_gemv_config`."""
    found = tuned_config("engine_awq", f"awq_c{chunk}", device, num_out, num_in, num_tokens)
    if found is not None:
        return GemvConfig(**{k: v for k, v in found.items() if k in GemvConfig._fields})
    return default_gemv_config(num_tokens, num_out, chunk)


def awq_gemv(
    x: torch.Tensor,
    tiled_qweight: torch.Tensor,
    tiled_zeros: torch.Tensor,
    scales: torch.Tensor,
    group_size: int,
    chunk: int,
    bias: torch.Tensor | None = None,
    config: GemvConfig | None = None,
    locks: torch.Tensor | None = None,
) -> torch.Tensor:
    """``x`` [M, K] (1 <= M <= 16; fp16/bf16, fp32 for tests) times the tiled AWQ weight ->
    [M, N] in ``x.dtype``, plus ``bias``. ``locks``: the caller's split-K counters
    (:func:`engine_sdk.layers.split_k.split_k_locks`, at least ``cdiv(N, block_n)``; a
    layer keeps one so that CUDA graphs need no memset); None makes zeroed ones per call."""
    weights = (tiled_qweight, tiled_zeros, scales, group_size, chunk)
    return _launch(x, weights, bias, config, locks, None)


def awq_gemv_add_rms_norm(
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
    config: GemvConfig | None = None,
    locks: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """:func:`awq_gemv` of ``rms_norm(x + residual) * norm_weight`` and ``x + residual``
    (the new residual) in one launch, for at most ``NORM_MAX_ROWS`` rows of
    :mod:`engine_sdk.layers.split_k`: equal to the decoder's add+norm kernel, then
    :func:`awq_gemv`."""
    norm = norm_args(x, residual, norm_weight, eps)
    weights = (tiled_qweight, tiled_zeros, scales, group_size, chunk)
    return _launch(x, weights, bias, config, locks, norm), norm.new_residual


def nibbles_per_group(
    x: torch.Tensor, weights: tuple[torch.Tensor, torch.Tensor, torch.Tensor, int, int]
) -> int:
    """Check ``x`` [M, K] against the tiled operands ``(tiled_qweight, tiled_zeros, scales,
    group_size, chunk)`` as the decode kernels read them (K a whole number of chunks,
    contiguous rows, nibble slices inside groups) and return ``NPG``, the nibbles of a
    chunk that share a group (their scale is applied once)."""
    tiled_qweight, tiled_zeros, scales, group_size, chunk = weights
    assert tiled_qweight.shape[1] * 8 == x.shape[1] and x.shape[1] % chunk == 0
    assert tiled_qweight.stride(1) == tiled_zeros.stride(1) == scales.stride(1) == 1
    assert x.stride(1) == 1 and group_size % (chunk // 8) == 0
    return math.gcd(8, group_size // (chunk // 8))


def _launch(
    x: torch.Tensor,
    weights: tuple[torch.Tensor, torch.Tensor, torch.Tensor, int, int],
    bias: torch.Tensor | None,
    config: GemvConfig | None,
    locks: torch.Tensor | None,
    norm: NormArgs | None,
) -> torch.Tensor:
    """One launch of the GEMV, with the add+norm prologue when ``norm`` is given."""
    tiled_qweight, tiled_zeros, scales, group_size, chunk = weights
    num_tokens, num_in = x.shape
    num_out = tiled_qweight.shape[0]
    assert 0 < num_tokens <= MAX_TOKENS, f"the GEMV takes 1 to {MAX_TOKENS} rows"
    npg = nibbles_per_group(x, weights)
    if config is None:
        config = gemv_config(x.device, num_tokens, num_out, num_in, chunk)
    use_dot = config.variant == "dot"
    block_m = 16 if use_dot else triton.next_power_of_2(num_tokens)
    assert not use_dot or (chunk == 128 and config.block_n >= 16), "dot needs chunk 128"
    num_chunks = num_in // chunk
    n_tiles = triton.cdiv(num_out, config.block_n)
    plan = plan_split_k(x, num_out, n_tiles, num_chunks, GEMV_PROGRAMS_PER_SM, config.split, locks)
    norm_operands, norm_constants = norm_launch_args(x, norm)
    _gemv_kernel[(n_tiles, plan.split)](
        x, tiled_qweight, tiled_zeros, scales, bias if bias is not None else scales, plan.out,
        plan.parts, plan.locks, num_tokens, num_out, num_chunks, plan.steps_per_split,
        plan.split, x.stride(0), tiled_qweight.stride(0), tiled_zeros.stride(0),
        scales.stride(0), plan.out.stride(0), MAGIC_2_23,
        *norm_operands,
        GROUP=group_size, CHUNK=chunk, NPG=npg, BLOCK_M=block_m, BLOCK_N=config.block_n,
        NUM_STAGES=config.num_stages,
        USE_DOT=use_dot, HAS_BIAS=bias is not None, SPLIT=plan.split > 1,
        num_warps=config.num_warps, **norm_constants, **pdl_launch(x),
    )  # fmt: skip
    return plan.out
