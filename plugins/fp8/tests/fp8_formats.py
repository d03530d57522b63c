"""Quantizers written from the documented checkpoint layouts (not from engine_fp8's code).

Each maps a float32 weight [out, in] to the tensors a checkpoint stores for that layer and
the float32 weight they represent (``fp8 value * scale``).
"""

from __future__ import annotations

import math
from typing import Any

import torch
from engine_sdk.testing.quantization import QuantizedWeights

E4M3_MAX = 448.0
DYNAMIC_TOKEN = {"num_bits": 8, "type": "float", "dynamic": True, "strategy": "token"}
DYNAMIC_TENSOR = {"num_bits": 8, "type": "float", "dynamic": True, "strategy": "tensor"}
STATIC = {"num_bits": 8, "type": "float", "dynamic": False, "strategy": "tensor"}


def ct_config(weights: dict[str, Any], acts: dict[str, Any] | None) -> dict[str, Any]:
    """A compressed-tensors float8 ``quantization_config`` with one group for all Linears."""
    group = {"targets": ["Linear"], "weights": {"num_bits": 8, "type": "float", **weights}}
    group["input_activations"] = acts
    return {
        "quant_method": "compressed-tensors",
        "format": "float-quantized",
        "config_groups": {"group_0": group},
        "ignore": ["lm_head"],
    }


def _cast(w: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    return (w / scale).clamp(-E4M3_MAX, E4M3_MAX).to(torch.float8_e4m3fn)


def per_tensor(w: torch.Tensor, scale_shape: tuple[int, ...] = ()) -> QuantizedWeights:
    """fp8 / compressed-tensors "tensor": ``weight_scale`` is a scalar ([] or [1])."""
    scale = w.abs().max() / E4M3_MAX
    q = _cast(w, scale)
    return QuantizedWeights(
        {"weight": q, "weight_scale": scale.reshape(scale_shape)}, q.float() * scale
    )


def per_channel(w: torch.Tensor) -> QuantizedWeights:
    """compressed-tensors "channel": ``weight_scale`` [out, 1]."""
    scale = w.abs().amax(dim=1, keepdim=True) / E4M3_MAX
    q = _cast(w, scale)
    return QuantizedWeights({"weight": q, "weight_scale": scale}, q.float() * scale)


def per_block(w: torch.Tensor, block: tuple[int, int], scale_name: str) -> QuantizedWeights:
    """Block-wise: one scale per ``block`` tile, [ceil(out/b0), ceil(in/b1)] (edge tiles are
    partial); ``weight_scale_inv`` in the fp8 layout, ``weight_scale`` in compressed-tensors."""
    rows, cols = w.shape
    b0, b1 = block
    scales = torch.empty(math.ceil(rows / b0), math.ceil(cols / b1))
    q = torch.empty(rows, cols, dtype=torch.float8_e4m3fn)
    deq = torch.empty(rows, cols)
    for i in range(scales.shape[0]):
        for j in range(scales.shape[1]):
            tile = w[i * b0 : (i + 1) * b0, j * b1 : (j + 1) * b1]
            scale = tile.abs().max() / E4M3_MAX
            scales[i, j] = scale
            q_tile = _cast(tile, scale)
            q[i * b0 : (i + 1) * b0, j * b1 : (j + 1) * b1] = q_tile
            deq[i * b0 : (i + 1) * b0, j * b1 : (j + 1) * b1] = q_tile.float() * scale
    return QuantizedWeights({"weight": q, scale_name: scales}, deq)


def with_input_scale(quantized: QuantizedWeights, value: float = 0.05) -> QuantizedWeights:
    """Static activations: a calibrated scalar ``input_scale``."""
    tensors = dict(quantized.tensors, input_scale=torch.tensor(value))
    return QuantizedWeights(tensors, quantized.dequantized)
