# mypy: disable-error-code="no-untyped-def,untyped-decorator"
"""W4A16 GEMM and dequantization on the tiled AWQ layout (:mod:`engine_awq.tiled`), in Triton.

``out [M, N] = x [M, K] @ W [K, N]`` with ``W = (q - z) * s`` read as 4-bit codes. A
program owns ``BLOCK_N`` output columns and ``BLOCK_M`` rows over a range of K chunks
(split-K: a decode step has few output tiles, so K is split until about
``PROGRAMS_PER_SM`` programs per multiprocessor run; the parts meet in
:func:`engine_sdk.layers.split_k.reduce_split_k`). Per chunk it loads the ``W`` words of
each of its rows (the next chunk's words, zero points and scales are requested before
this chunk is computed),
and per nibble ``i`` the ``W`` activations that nibble multiplies. Zero points and scales
are applied once per group slice, not per weight::

    sum_k x[k] (q[k] - z) s  =  s * (sum_k x[k] q[k]  -  z * sum_k x[k])

Two inner products (``VARIANT``):

- ``fma`` (few rows): codes become floats without an int->float conversion:
  ``(word & 0xF << 4i) | 0x4B000000`` read as float32 is ``2^23 + q * 16^i`` exactly, so a
  subtraction gives ``q * 16^i`` and ``16^-i`` is folded into that nibble's activations
  (exact, a power of two). Nibbles 5..7 are read from ``word >> 12`` the same way. Products
  accumulate in a [BLOCK_M, BLOCK_N, W] register tile ([BLOCK_N, W] for one token), summed
  over W once per chunk.
- ``dot`` (more rows): the codes of nibble ``i`` are a [BLOCK_N, W = 16] tile of small
  integers, exact in fp16/bf16, multiplied by tensor cores against x's [BLOCK_M, 16] slice.

``awq_w4a16_dequantize`` writes the dense weight (the large-batch path multiplies it with
cuBLAS).
"""

from __future__ import annotations

from typing import NamedTuple

import torch
import triton
import triton.language as tl

__all__ = ["GemmConfig", "awq_w4a16_dequantize", "awq_w4a16_gemm", "default_config"]

PROGRAMS_PER_SM = 4


class GemmConfig(NamedTuple):
    """Tile shape and launch options of one W4A16 GEMM call."""

    variant: str  # "fma" or "dot"
    block_m: int
    block_n: int
    num_warps: int = 4
    split: int | None = None  # None: fill the GPU (PROGRAMS_PER_SM per multiprocessor)


@triton.jit
def nibble_bits(words, hi, i: tl.constexpr, magic=0x4B000000):
    """Nibble ``i`` of ``words`` as float32 ``2^23 + q * 2^e``, ``e = 4i`` for ``i < 5`` and
    ``4 (i - 3)`` above (read from ``hi = words >> 12``; every field stays below bit 23).
    ``magic`` is 0x4B000000 (the bits of 2^23); passed as a kernel argument rather than a
    constant, the mask and the or become one ``LOP3`` (it takes one immediate)."""
    if i < 5:
        bits = (words & (0xF << (4 * i))) | magic
    else:
        bits = (hi & (0xF << (4 * (i - 3)))) | magic
    return bits.to(tl.float32, bitcast=True)


@triton.jit
def _codes_scaled(words, hi, i: tl.constexpr):
    """Nibble ``i`` of ``words`` as float32 ``q * 2^e`` (see :func:`nibble_bits`)."""
    return nibble_bits(words, hi, i) - 8388608.0


@triton.jit
def _chunk_partial(
    x_rows,
    mask_m,
    words,
    k0,
    FIRST: tl.constexpr,
    LAST: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    W: tl.constexpr,
    USE_DOT: tl.constexpr,
):
    """(sum over nibbles FIRST..LAST-1 of x . q  [BLOCK_M, BLOCK_N], sum of those x [BLOCK_M])."""
    xsum = tl.zeros((BLOCK_M,), dtype=tl.float32)
    if USE_DOT:
        part = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
        for i in tl.static_range(FIRST, LAST):
            x = tl.load(x_rows + k0 + i * W, mask=mask_m[:, None], other=0.0)
            codes = ((words >> (4 * i)) & 0xF).to(x.dtype)
            part = tl.dot(x, tl.trans(codes), part)
            xsum += tl.sum(x.to(tl.float32), axis=1)
    elif BLOCK_M == 1:  # decode: a [BLOCK_N, W] product tile, no third dimension
        hi = words >> 12
        prod2 = tl.zeros((BLOCK_N, W), dtype=tl.float32)
        for i in tl.static_range(FIRST, LAST):
            x = tl.load(x_rows + k0 + i * W, mask=mask_m[:, None], other=0.0).to(tl.float32)
            xsum += tl.sum(x, axis=1)
            x = x * (1.0 / (1 << (4 * i - 12 * (i // 5))))
            prod2 += x * _codes_scaled(words, hi, i)  # [1, W] broadcast over the rows
        part = tl.sum(prod2, axis=1)[None, :]
    else:
        hi = words >> 12
        prod = tl.zeros((BLOCK_M, BLOCK_N, W), dtype=tl.float32)
        for i in tl.static_range(FIRST, LAST):
            x = tl.load(x_rows + k0 + i * W, mask=mask_m[:, None], other=0.0).to(tl.float32)
            xsum += tl.sum(x, axis=1)
            x = x * (1.0 / (1 << (4 * i - 12 * (i // 5))))
            prod += x[:, None, :] * _codes_scaled(words, hi, i)[None, :, :]
        part = tl.sum(prod, axis=2)
    return part, xsum


@triton.jit
def _load_group(z_ptr, s_ptr, g, stride_z, stride_s, offs_n, mask):
    """(zero points, scales) of group ``g`` as float32 [BLOCK_N]; zeros where ``mask`` is off."""
    z = tl.load(z_ptr + g * stride_z + offs_n, mask=mask, other=0).to(tl.float32)
    s = tl.load(s_ptr + g * stride_s + offs_n, mask=mask, other=0.0).to(tl.float32)
    return z, s


@triton.jit
def _apply_group(acc, part, xsum, z, s):
    return acc + s[None, :] * (part - xsum[:, None] * z[None, :])


@triton.jit
def _w4a16_kernel(
    x_ptr,
    qw_ptr,
    z_ptr,
    s_ptr,
    bias_ptr,
    out_ptr,
    M,
    N,
    num_chunks,
    chunks_per_split,
    stride_xm,
    stride_qw,
    stride_z,
    stride_s,
    stride_op,
    stride_om,
    GROUP: tl.constexpr,
    CHUNK: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    USE_DOT: tl.constexpr,
    HAS_BIAS: tl.constexpr,
    SPLIT: tl.constexpr,
):
    W: tl.constexpr = CHUNK // 8
    pid_n = tl.program_id(0)
    pid_s = tl.program_id(1)
    pid_m = tl.program_id(2)
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_j = tl.arange(0, W)
    mask_m = offs_m < M
    mask_n = offs_n < N
    x_rows = x_ptr + offs_m[:, None] * stride_xm + offs_j[None, :]
    qw_rows = qw_ptr + offs_n[:, None] * stride_qw + offs_j[None, :]
    c_start = pid_s * chunks_per_split
    c_end = tl.minimum(c_start + chunks_per_split, num_chunks)
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    words = tl.load(qw_rows + c_start * W, mask=mask_n[:, None] & (c_start < c_end), other=0)
    z, s = _load_group(z_ptr, s_ptr, (c_start * CHUNK) // GROUP, stride_z, stride_s, offs_n, mask_n)
    for c in range(c_start, c_end):
        # Ask for the next chunk's words (and its zeros and scales) before this chunk's
        # arithmetic.
        has_next = c + 1 < c_end
        nxt = tl.load(qw_rows + (c + 1) * W, mask=mask_n[:, None] & has_next, other=0)
        k0 = c * CHUNK
        if GROUP % CHUNK == 0:  # the whole chunk shares one zero and scale
            nxt_z, nxt_s = _load_group(
                z_ptr, s_ptr, (k0 + CHUNK) // GROUP, stride_z, stride_s, offs_n,
                mask_n & has_next,
            )  # fmt: skip
            part, xsum = _chunk_partial(
                x_rows, mask_m, words, k0, 0, 8, BLOCK_M, BLOCK_N, W, USE_DOT
            )
            acc = _apply_group(acc, part, xsum, z, s)
            z, s = nxt_z, nxt_s
        else:  # groups smaller than a chunk: one zero and scale per nibble slice
            for i in tl.static_range(8):
                part, xsum = _chunk_partial(
                    x_rows, mask_m, words, k0, i, i + 1, BLOCK_M, BLOCK_N, W, USE_DOT
                )
                zi, si = _load_group(
                    z_ptr, s_ptr, (k0 + i * W) // GROUP, stride_z, stride_s, offs_n, mask_n
                )
                acc = _apply_group(acc, part, xsum, zi, si)
        words = nxt
    mask = mask_m[:, None] & mask_n[None, :]
    if SPLIT:
        tl.store(
            out_ptr + pid_s * stride_op + offs_m[:, None] * stride_om + offs_n[None, :],
            acc,
            mask=mask,
        )
    else:
        if HAS_BIAS:
            acc += tl.load(bias_ptr + offs_n, mask=mask_n, other=0.0).to(tl.float32)[None, :]
        out_tile = out_ptr + offs_m[:, None] * stride_om + offs_n[None, :]
        tl.store(out_tile, acc.to(out_ptr.dtype.element_ty), mask=mask)


@triton.jit
def _dequant_kernel(
    qw_ptr, z_ptr, s_ptr, out_ptr, N, stride_qw, stride_z, stride_s, stride_on,
    GROUP: tl.constexpr, CHUNK: tl.constexpr, BLOCK_N: tl.constexpr,
):  # fmt: skip
    W: tl.constexpr = CHUNK // 8
    pid_n = tl.program_id(0)
    c = tl.program_id(1)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_j = tl.arange(0, W)
    mask_n = offs_n < N
    words_tile = qw_ptr + offs_n[:, None] * stride_qw + c * W + offs_j[None, :]
    words = tl.load(words_tile, mask=mask_n[:, None], other=0)
    for i in tl.static_range(8):
        k = c * CHUNK + i * W
        g = k // GROUP
        z = tl.load(z_ptr + g * stride_z + offs_n, mask=mask_n, other=0).to(tl.float32)
        s = tl.load(s_ptr + g * stride_s + offs_n, mask=mask_n, other=0.0).to(tl.float32)
        w = (((words >> (4 * i)) & 0xF).to(tl.float32) - z[:, None]) * s[:, None]
        out = out_ptr + offs_n[:, None] * stride_on + k + offs_j[None, :]
        tl.store(out, w.to(out_ptr.dtype.element_ty), mask=mask_n[:, None])


def default_config(num_tokens: int, num_out: int, chunk: int, variant: str) -> GemmConfig:
    """The tile for ``num_tokens`` rows in ``variant`` (``fma`` | ``dot``; ``dot`` needs
    16-row nibble slices, ``chunk`` 128). Narrower tiles for narrow layers, so that more
    programs run."""
    block_n = 128 if num_out >= 4096 else 64
    if variant == "fma":
        block_m = min(triton.next_power_of_2(num_tokens), 16)
        # The [BLOCK_M, BLOCK_N, W] product tile lives in registers.
        while block_m * block_n * (chunk // 8) > 8192 and block_n > 16:
            block_n //= 2
        return GemmConfig("fma", block_m, block_n)
    if chunk != 128:
        raise ValueError(f"the dot variant needs chunk 128, not {chunk}")
    block_m = 16 if num_tokens <= 16 else 32 if num_tokens <= 32 else 64
    return GemmConfig("dot", block_m, block_n)


def awq_w4a16_gemm(
    x: torch.Tensor,
    tiled_qweight: torch.Tensor,
    tiled_zeros: torch.Tensor,
    scales: torch.Tensor,
    group_size: int,
    chunk: int,
    bias: torch.Tensor | None = None,
    config: GemmConfig | None = None,
) -> torch.Tensor:
    """``x`` [M, K] (fp16/bf16; fp32 for tests) times the tiled AWQ weight -> [M, N] in
    ``x.dtype``, plus ``bias``. Tensors may be row blocks / column blocks of merged ones
    (strided rows), but each row must be contiguous."""
    from engine_sdk.layers.split_k import num_multiprocessors, pick_split, reduce_split_k

    num_tokens, num_in = x.shape
    num_out = tiled_qweight.shape[0]
    assert tiled_qweight.shape[1] * 8 == num_in and num_in % chunk == 0
    assert tiled_qweight.stride(1) == tiled_zeros.stride(1) == scales.stride(1) == 1
    assert x.stride(1) == 1
    if config is None:
        variant = "dot" if num_tokens > 4 and chunk == 128 else "fma"
        config = default_config(num_tokens, num_out, chunk, variant)
    use_dot = config.variant == "dot"
    if use_dot and chunk != 128:
        raise ValueError("the dot variant needs chunk 128 (16-row nibble slices)")
    num_chunks = num_in // chunk
    m_tiles = triton.cdiv(num_tokens, config.block_m)
    n_tiles = triton.cdiv(num_out, config.block_n)
    if config.split is None:
        target = PROGRAMS_PER_SM * num_multiprocessors(x.device)
        split, chunks_per_split = pick_split(m_tiles * n_tiles, num_chunks, target)
    else:
        split, chunks_per_split = pick_split(1, num_chunks, config.split)
    if split > 1:
        out = torch.empty(split, num_tokens, num_out, dtype=torch.float32, device=x.device)
        stride_op, stride_om = out.stride(0), out.stride(1)
    else:
        out = torch.empty(num_tokens, num_out, dtype=x.dtype, device=x.device)
        stride_op, stride_om = 0, out.stride(0)
    _w4a16_kernel[(n_tiles, split, m_tiles)](
        x, tiled_qweight, tiled_zeros, scales, bias if bias is not None else scales, out,
        num_tokens, num_out, num_chunks, chunks_per_split,
        x.stride(0), tiled_qweight.stride(0), tiled_zeros.stride(0), scales.stride(0),
        stride_op, stride_om,
        GROUP=group_size, CHUNK=chunk, BLOCK_M=config.block_m, BLOCK_N=config.block_n,
        USE_DOT=use_dot, HAS_BIAS=bias is not None, SPLIT=split > 1,
        num_warps=config.num_warps,
    )  # fmt: skip
    if split > 1:
        return reduce_split_k(out, bias, x.dtype)
    return out


def awq_w4a16_dequantize(
    tiled_qweight: torch.Tensor,
    tiled_zeros: torch.Tensor,
    scales: torch.Tensor,
    group_size: int,
    chunk: int,
    dtype: torch.dtype,
) -> torch.Tensor:
    """The dense weight [N, K] (``nn.Linear`` orientation) in ``dtype``, in one pass."""
    num_out, num_words = tiled_qweight.shape
    out = torch.empty(num_out, num_words * 8, dtype=dtype, device=tiled_qweight.device)
    block_n = 64
    _dequant_kernel[(triton.cdiv(num_out, block_n), num_words * 8 // chunk)](
        tiled_qweight, tiled_zeros, scales, out, num_out,
        tiled_qweight.stride(0), tiled_zeros.stride(0), scales.stride(0), out.stride(0),
        GROUP=group_size, CHUNK=chunk, BLOCK_N=block_n, num_warps=4,
    )  # fmt: skip
    return out
