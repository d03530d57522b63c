"""AutoAWQ GEMM packing: eight 4-bit values per int32, in AutoAWQ's interleaved order.

A weight ``W`` [in, out] (note: transposed relative to ``nn.Linear``) is stored as::

    qweight  int32 [in, out / 8]         4-bit codes q
    qzeros   int32 [in / group, out / 8] 4-bit zero points z, one per (group, column)
    scales   fp16  [in / group, out]     one scale per (group, column)
    W[k, n] = (q[k, n] - z[k // group, n]) * s[k // group, n]

Within one int32, AutoAWQ packs the eight columns n0..n0+7 so that nibble ``i`` (bits
4i..4i+3) holds column ``n0 + AWQ_ORDER[i]``::

    nibble:   7   6   5   4   3   2   1   0
    column:  +7  +5  +3  +1  +6  +4  +2  +0      AWQ_ORDER = [0, 2, 4, 6, 1, 3, 5, 7]

so column ``n0 + j`` sits in nibble ``AWQ_REVERSE_ORDER[j]`` = ``j // 2 + 4 * (j % 2)``.
(AutoAWQ ``WQLinear_GEMM.from_linear`` packs with ``order_map``; its ``unpack_awq`` /
``reverse_awq_order`` and vLLM's ``awq_triton`` undo it with the reverse order.)
"""

from __future__ import annotations

import torch

__all__ = [
    "AWQ_ORDER",
    "AWQ_REVERSE_ORDER",
    "PACK_FACTOR",
    "awq_dequantize",
    "awq_quantize",
    "pack_awq",
    "unpack_awq",
]

PACK_FACTOR = 8  # 4-bit values per int32
AWQ_ORDER = (0, 2, 4, 6, 1, 3, 5, 7)
AWQ_REVERSE_ORDER = (0, 4, 1, 5, 2, 6, 3, 7)


def _shifts(device: torch.device) -> torch.Tensor:
    """Bit offset of column ``j`` (0..7) of a packed group."""
    return torch.tensor([4 * i for i in AWQ_REVERSE_ORDER], dtype=torch.int32, device=device)


def pack_awq(values: torch.Tensor) -> torch.Tensor:
    """int [rows, cols] with values 0..15 -> int32 [rows, cols / 8] in AutoAWQ's order."""
    rows, cols = values.shape
    if cols % PACK_FACTOR:
        raise ValueError(f"AWQ packs 8 columns per int32; {cols} columns is not a multiple of 8")
    if values.min() < 0 or values.max() > 15:
        raise ValueError("AWQ 4-bit values must lie in 0..15")
    grouped = values.to(torch.int64).reshape(rows, cols // PACK_FACTOR, PACK_FACTOR)
    packed = torch.zeros(rows, cols // PACK_FACTOR, dtype=torch.int64, device=values.device)
    for nibble, column in enumerate(AWQ_ORDER):
        packed |= grouped[:, :, column] << (4 * nibble)
    # Reinterpret the low 32 bits as a signed int32, as torch stores AutoAWQ's tensors.
    packed = torch.where(packed >= 2**31, packed - 2**32, packed)
    return packed.to(torch.int32)


def unpack_awq(packed: torch.Tensor) -> torch.Tensor:
    """int32 [rows, cols / 8] -> int32 [rows, cols] of values 0..15 in column order."""
    rows, num_packed = packed.shape
    values = (packed[:, :, None] >> _shifts(packed.device)) & 0xF
    return values.reshape(rows, num_packed * PACK_FACTOR)


def awq_dequantize(
    qweight: torch.Tensor,
    qzeros: torch.Tensor,
    scales: torch.Tensor,
    group_size: int,
    dtype: torch.dtype | None = None,
) -> torch.Tensor:
    """The reference dequantization: W [in, out] = (q - z) * s, in ``dtype`` (default the
    scales' dtype). Computed in float32 and rounded once."""
    q = unpack_awq(qweight)
    z = unpack_awq(qzeros).repeat_interleave(group_size, dim=0)
    s = scales.float().repeat_interleave(group_size, dim=0)
    w = (q - z).float() * s
    return w.to(dtype or scales.dtype)


def awq_quantize(
    weight: torch.Tensor, group_size: int
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Asymmetric 4-bit round-to-nearest of an ``nn.Linear`` weight [out, in], AutoAWQ style.

    Returns (qweight int32 [in, out/8], qzeros int32 [in/group, out/8], scales fp16
    [in/group, out]). No activation-aware scaling search (that changes which weights are
    quantized, not the stored layout), so it is what tests and benchmarks need.
    """
    num_out, num_in = weight.shape
    if num_in % group_size:
        raise ValueError(f"in_features {num_in} is not a multiple of group_size {group_size}")
    w = weight.float().t().reshape(num_in // group_size, group_size, num_out)
    w_max, w_min = w.amax(dim=1), w.amin(dim=1)
    scales = ((w_max - w_min).clamp(min=1e-5) / 15).to(torch.float16)
    s = scales.float()
    zeros = (-torch.round(w_min / s)).clamp(0, 15)
    q = (torch.round(w / s[:, None, :]) + zeros[:, None, :]).clamp(0, 15)
    qweight = pack_awq(q.reshape(num_in, num_out).to(torch.int32))
    qzeros = pack_awq(zeros.to(torch.int32))
    return qweight, qzeros, scales
