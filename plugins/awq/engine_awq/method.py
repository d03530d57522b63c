"""The AWQ linear method: packed 4-bit parameters of one layer and its matmul.

Parameters are the checkpoint's, by name: ``qweight`` int32 [in, out/8], ``qzeros`` int32
[in/group, out/8], ``scales`` fp16 [in/group, out] (layout in :mod:`engine_awq.packing`).

Matmul paths:

- CUDA, fp16/bf16 activations, up to ``TRITON_MAX_TOKENS`` tokens: the fused Triton
  dequantize-GEMM (:mod:`engine_awq.triton_gemm`), which reads 4-bit weights only.
- CUDA with more tokens (prefill): dequantize once per call and use the dense matmul,
  which is compute-bound there and faster than the fused kernel.
- CPU (and CUDA without Triton): the torch reference, dequantize then matmul.

Merging (:meth:`AwqLinearMethod.merge`, for q/k/v and gate/up): the three tensors are
concatenated along their output (N) dimension, which packing never crosses (8 columns per
int32, and every layer has a multiple of 8 outputs), so one kernel launch computes all::

    qweight [K, Nq/8 | Nk/8 | Nv/8]   qzeros [K/G, Nq/8 | ...]   scales [K/G, Nq | Nk | Nv]

The original layers keep column views of the merged tensors.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from engine_sdk.interfaces.quantization import QuantizationMethod
from engine_sdk.layers.linear import share_merged
from engine_sdk.runtime import triton_available

from engine_awq.packing import PACK_FACTOR, awq_dequantize

__all__ = ["AwqLinearMethod", "TRITON_MAX_TOKENS"]

TRITON_MAX_TOKENS = 256


def _exact_loader(layer_name: str):  # type: ignore[no-untyped-def]
    """Copy a packed tensor, refusing a dtype change (a float qweight is not AWQ)."""

    def load(param: torch.nn.Parameter, tensor: torch.Tensor) -> None:
        if tuple(tensor.shape) != tuple(param.shape):
            raise ValueError(
                f"{layer_name}: AWQ tensor has shape {tuple(tensor.shape)}, the layer expects "
                f"{tuple(param.shape)}; check group_size in quantization_config"
            )
        if param.dtype == torch.int32 and tensor.dtype != torch.int32:
            raise ValueError(
                f"{layer_name}: packed AWQ tensor is {tensor.dtype}, expected int32 "
                "(AutoAWQ GEMM layout)"
            )
        param.data.copy_(tensor)

    return load


class AwqLinearMethod(QuantizationMethod):
    """AutoAWQ GEMM 4-bit weights with zero points, ``group_size`` rows per scale."""

    def __init__(self, group_size: int) -> None:
        self.group_size = group_size

    def create_weights(
        self,
        layer: torch.nn.Module,
        input_size: int,
        output_size: int,
        params_dtype: torch.dtype,
    ) -> None:
        name = getattr(layer, "prefix", "") or "linear"
        group_size = input_size if self.group_size == -1 else self.group_size
        if output_size % PACK_FACTOR:
            raise ValueError(
                f"{name}: AWQ packs 8 output columns per int32 but out_features is "
                f"{output_size}; this layer cannot be AWQ-quantized"
            )
        if input_size % group_size:
            raise ValueError(
                f"{name}: in_features {input_size} is not a multiple of AWQ group_size "
                f"{group_size}; the checkpoint's group_size must divide every layer's input"
            )
        layer.awq_group_size = group_size
        num_groups = input_size // group_size
        tensors = {
            "qweight": torch.empty(input_size, output_size // PACK_FACTOR, dtype=torch.int32),
            "qzeros": torch.empty(num_groups, output_size // PACK_FACTOR, dtype=torch.int32),
            "scales": torch.empty(num_groups, output_size, dtype=torch.float16),
        }
        for param_name, tensor in tensors.items():
            param = torch.nn.Parameter(tensor, requires_grad=False)
            param.weight_loader = _exact_loader(f"{name}.{param_name}")  # type: ignore[attr-defined]
            layer.register_parameter(param_name, param)

    def process_weights_after_loading(self, layer: torch.nn.Module) -> None:
        from engine_awq.triton_gemm import pick_block_k

        layer.awq_use_triton = (
            layer.qweight.device.type == "cuda"
            and triton_available()
            and pick_block_k(layer.awq_group_size) is not None
        )

    def dequantize_weight(self, layer: torch.nn.Module, dtype: torch.dtype) -> torch.Tensor:
        """The layer's weight as ``dtype`` [out, in] (``nn.Linear`` orientation)."""
        w = awq_dequantize(layer.qweight, layer.qzeros, layer.scales, layer.awq_group_size, dtype)
        return w.t()

    def apply(
        self, layer: torch.nn.Module, x: torch.Tensor, bias: torch.Tensor | None = None
    ) -> torch.Tensor:
        x2 = x.reshape(-1, x.shape[-1])
        use_kernel = (
            getattr(layer, "awq_use_triton", False)
            and x.dtype in (torch.float16, torch.bfloat16)
            and x2.shape[0] <= TRITON_MAX_TOKENS
        )
        if use_kernel:
            from engine_awq.triton_gemm import awq_gemm_triton

            out = awq_gemm_triton(
                x2, layer.qweight, layer.qzeros, layer.scales, layer.awq_group_size
            )
        else:
            w = awq_dequantize(
                layer.qweight, layer.qzeros, layer.scales, layer.awq_group_size, x.dtype
            )
            out = x2 @ w
        if bias is not None:
            out = out + bias
        return out.reshape(*x.shape[:-1], out.shape[-1])

    def merge(
        self, layers: Sequence[torch.nn.Module], merged: torch.nn.Module
    ) -> QuantizationMethod | None:
        """Concatenate ``qweight``, ``qzeros`` and ``scales`` along N; ``None`` unless the
        layers share the group size, the kernel choice and the tensors' dtypes and device."""
        first = layers[0]
        same = all(
            isinstance(layer.quant_method, AwqLinearMethod)
            and layer.awq_group_size == first.awq_group_size
            and getattr(layer, "awq_use_triton", False) == getattr(first, "awq_use_triton", False)
            for layer in layers
        )
        if not same or len({_tensor_kinds(layer) for layer in layers}) != 1:
            return None
        for name in _PACKED_NAMES:
            tensor = torch.cat([getattr(layer, name).data for layer in layers], dim=1)
            merged.register_parameter(name, torch.nn.Parameter(tensor, requires_grad=False))
            sizes = [getattr(layer, name).shape[1] for layer in layers]
            share_merged(layers, name, tensor, dim=1, sizes=sizes)
        merged.awq_group_size = first.awq_group_size
        merged.awq_use_triton = getattr(first, "awq_use_triton", False)
        return AwqLinearMethod(self.group_size)


_PACKED_NAMES = ("qweight", "qzeros", "scales")


def _tensor_kinds(layer: torch.nn.Module) -> tuple[tuple[torch.dtype, torch.device], ...]:
    return tuple((getattr(layer, n).dtype, getattr(layer, n).device) for n in _PACKED_NAMES)
