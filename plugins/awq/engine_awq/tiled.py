"""The AWQ weight layout the W4A16 kernels read, repacked from AutoAWQ's at load time.

AutoAWQ packs eight *columns* per int32 (``qweight`` [K, N/8]), so a kernel reading along
K for one output column touches one nibble of each word it loads. The tiled layout packs
eight *rows of K* per int32, per output column, with K cut into chunks of ``CHUNK`` rows
and the nibbles interleaved so that nibble ``i`` of the chunk's ``W = CHUNK / 8`` words
holds the contiguous K slice ``[i * W, (i + 1) * W)``::

    tiled_qweight int32 [N, K / 8]       row n: chunk 0 words | chunk 1 words | ...
    word (n, c * W + j), nibble i  =  q[k = c * CHUNK + i * W + j, n]     (0 <= j < W)

    chunk c of row n, CHUNK = 128 (W = 16 words, one 64-byte load):
      word:    j=0        j=1        ...   j=15
      nibble 0 k=0        k=1        ...   k=15
      nibble 1 k=16       k=17       ...   k=31
      ...
      nibble 7 k=112      k=113      ...   k=127

One load of a row's ``W`` words gives the kernel all ``CHUNK`` codes of that row; nibble
``i`` of the ``W`` words lines up with ``W`` consecutive activations (one contiguous load of
x), and with ``W = 16`` it is exactly one ``K = 16`` tensor-core step. Zero points are
unpacked to one byte each (``tiled_zeros`` uint8 [K/G, N]); ``scales`` fp16 [K/G, N] stay
as the checkpoint has them. The slice of a nibble never straddles two groups (``W`` divides
the group size), so every code has one zero and one scale.
"""

from __future__ import annotations

import torch

from engine_awq.packing import unpack_awq

__all__ = [
    "CHUNK_CHOICES",
    "dequantize_tiled",
    "pick_chunk",
    "repack_tiled",
    "unpack_tiled",
]

CHUNK_CHOICES = (128, 64, 32)
_COLUMN_BLOCK = 1024  # columns repacked at a time (bounds the int64 temporaries)


def pick_chunk(num_in: int, group_size: int) -> int | None:
    """The largest chunk of ``CHUNK_CHOICES`` that divides K and whose nibble slice
    (``chunk / 8`` rows) divides the group size; None when none fits."""
    for chunk in CHUNK_CHOICES:
        if num_in % chunk == 0 and group_size % (chunk // 8) == 0:
            return chunk
    return None


def _pack_rows(codes: torch.Tensor, chunk: int) -> torch.Tensor:
    """int [K, n] codes 0..15 -> int32 [n, K / 8] in the tiled order."""
    num_in, num_cols = codes.shape
    words_per_chunk = chunk // 8
    # k = c * chunk + i * W + j  ->  [c, i, j, n]  ->  [n, c, j, i]
    grouped = codes.to(torch.int64).reshape(num_in // chunk, 8, words_per_chunk, num_cols)
    grouped = grouped.permute(3, 0, 2, 1)
    shifts = torch.arange(0, 32, 4, dtype=torch.int64, device=codes.device)
    words = (grouped << shifts).sum(dim=-1)
    words = torch.where(words >= 2**31, words - 2**32, words)  # low 32 bits, signed
    return words.to(torch.int32).reshape(num_cols, num_in // 8)


def repack_tiled(
    qweight: torch.Tensor, qzeros: torch.Tensor, chunk: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """AutoAWQ ``qweight`` [K, N/8] and ``qzeros`` [K/G, N/8] -> (``tiled_qweight`` int32
    [N, K/8], ``tiled_zeros`` uint8 [K/G, N]); on the tensors' device, a column block at a
    time."""
    num_in, num_packed = qweight.shape
    if num_in % chunk:
        raise ValueError(f"K={num_in} is not a multiple of the tiled chunk {chunk}")
    num_out = num_packed * 8
    tiled = torch.empty(num_out, num_in // 8, dtype=torch.int32, device=qweight.device)
    step = _COLUMN_BLOCK // 8
    for start in range(0, num_packed, step):
        codes = unpack_awq(qweight[:, start : start + step])
        tiled[start * 8 : start * 8 + codes.shape[1]] = _pack_rows(codes, chunk)
    zeros = unpack_awq(qzeros).to(torch.uint8)
    return tiled, zeros


def unpack_tiled(tiled_qweight: torch.Tensor, chunk: int) -> torch.Tensor:
    """int32 [N, K/8] tiled -> int32 codes [K, N] (the inverse of the repack)."""
    num_out, num_words = tiled_qweight.shape
    words_per_chunk = chunk // 8
    shifts = torch.arange(0, 32, 4, dtype=torch.int32, device=tiled_qweight.device)
    nibbles = (tiled_qweight[:, :, None] >> shifts) & 0xF  # [n, c * W + j, i]
    nibbles = nibbles.reshape(num_out, num_words // words_per_chunk, words_per_chunk, 8)
    codes = nibbles.permute(1, 3, 2, 0)  # [c, i, j, n]
    return codes.reshape(num_words * 8, num_out)


def dequantize_tiled(
    tiled_qweight: torch.Tensor,
    tiled_zeros: torch.Tensor,
    scales: torch.Tensor,
    group_size: int,
    chunk: int,
    dtype: torch.dtype | None = None,
) -> torch.Tensor:
    """The torch reference: W [K, N] = (q - z) * s in ``dtype`` (default the scales'),
    computed in float32 and rounded once, as :func:`engine_awq.packing.awq_dequantize`."""
    q = unpack_tiled(tiled_qweight, chunk)
    z = tiled_zeros.to(torch.int32).repeat_interleave(group_size, dim=0)
    s = scales.float().repeat_interleave(group_size, dim=0)
    return ((q - z).float() * s).to(dtype or scales.dtype)
