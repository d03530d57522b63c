"""An AutoAWQ GEMM quantizer written from AutoAWQ's documented packing (not engine_awq's code).

``WQLinear_GEMM.from_linear``: ``intweight = round(W / s) + z`` per (group, column), then
``for i in range(8): qweight[:, col] |= intweight[:, col * 8 + order_map[i]] << (i * 4)`` with
``order_map = [0, 2, 4, 6, 1, 3, 5, 7]``; zeros are packed the same way; scales are fp16.
"""

from __future__ import annotations

import torch
from engine_sdk.testing.quantization import QuantizedWeights

ORDER_MAP = [0, 2, 4, 6, 1, 3, 5, 7]


def autoawq_pack(intweight: torch.Tensor) -> torch.Tensor:
    """[rows, cols] ints 0..15 -> int32 [rows, cols / 8], AutoAWQ's loop verbatim in spirit."""
    rows, cols = intweight.shape
    packed = torch.zeros(rows, cols // 8, dtype=torch.int64)
    for col in range(cols // 8):
        for i in range(8):
            packed[:, col] |= intweight[:, col * 8 + ORDER_MAP[i]].to(torch.int64) << (i * 4)
    # The low 32 bits as a signed int32, as torch saves AutoAWQ's tensors.
    return torch.where(packed >= 2**31, packed - 2**32, packed).to(torch.int32)


def awq_gemm(weight: torch.Tensor, group_size: int) -> QuantizedWeights:
    """nn.Linear weight [out, in] -> qweight/qzeros/scales and the weight they represent."""
    num_out, num_in = weight.shape
    w = weight.t().contiguous()  # [in, out]
    groups = w.reshape(num_in // group_size, group_size, num_out)
    w_max, w_min = groups.amax(dim=1), groups.amin(dim=1)
    scales = ((w_max - w_min) / 15).clamp(min=1e-5).half()
    zeros = torch.clamp(-torch.round(w_min / scales.float()), 0, 15).to(torch.int32)
    s_rows = scales.float().repeat_interleave(group_size, dim=0)
    z_rows = zeros.repeat_interleave(group_size, dim=0)
    intweight = torch.clamp(torch.round(w / s_rows) + z_rows, 0, 15).to(torch.int32)
    dequantized = ((intweight - z_rows).float() * s_rows).t().contiguous()
    tensors = {
        "qweight": autoawq_pack(intweight),
        "qzeros": autoawq_pack(zeros),
        "scales": scales,
    }
    return QuantizedWeights(tensors, dequantized)
