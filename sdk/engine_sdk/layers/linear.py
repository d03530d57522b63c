"""A linear layer whose weights and matmul come from a ``QuantizationMethod``.

Models build every projection as ``Linear(in, out, bias, quant_config, prefix)``; the
layer asks ``quant_config.get_method(prefix)`` (``prefix`` is the HF module name, such as
``model.layers.0.self_attn.q_proj``) and falls back to :class:`UnquantizedLinearMethod`.
Parameter names are the checkpoint's (``weight``, ``bias``, or whatever the method
registers, e.g. ``weight_scale``), so the generic weight loader copies them by name.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from engine_sdk.interfaces.quantization import QuantizationMethod

if TYPE_CHECKING:
    from engine_sdk.interfaces.quantization import QuantizationConfig

__all__ = ["Linear", "UnquantizedLinearMethod", "merge_linears"]


class UnquantizedLinearMethod(QuantizationMethod):
    """A plain ``[output_size, input_size]`` weight in the model dtype."""

    def create_weights(
        self,
        layer: torch.nn.Module,
        input_size: int,
        output_size: int,
        params_dtype: torch.dtype,
    ) -> None:
        weight = torch.empty(output_size, input_size, dtype=params_dtype)
        layer.register_parameter("weight", torch.nn.Parameter(weight, requires_grad=False))

    def apply(
        self, layer: torch.nn.Module, x: torch.Tensor, bias: torch.Tensor | None = None
    ) -> torch.Tensor:
        weight: torch.Tensor = layer.weight  # type: ignore[assignment]
        return torch.nn.functional.linear(x, weight, bias)


class Linear(torch.nn.Module):
    """``y = x @ W.T + b`` with ``W`` stored and applied by the layer's quantization method."""

    def __init__(
        self,
        input_size: int,
        output_size: int,
        bias: bool = False,
        quant_config: QuantizationConfig | None = None,
        prefix: str = "",
        params_dtype: torch.dtype | None = None,
    ) -> None:
        super().__init__()
        self.input_size = input_size
        self.output_size = output_size
        self.prefix = prefix
        dtype = params_dtype or torch.get_default_dtype()
        method = quant_config.get_method(prefix) if quant_config is not None else None
        self.quant_method: QuantizationMethod = method or UnquantizedLinearMethod()
        self.quant_method.create_weights(self, input_size, output_size, dtype)
        if bias:
            self.bias = torch.nn.Parameter(
                torch.empty(output_size, dtype=dtype), requires_grad=False
            )
        else:
            self.register_parameter("bias", None)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.quant_method.apply(self, x, self.bias)

    def extra_repr(self) -> str:
        method = type(self.quant_method).__name__
        return f"in={self.input_size}, out={self.output_size}, method={method}"


def merge_linears(layers: list[Linear]) -> Linear | None:
    """One ``Linear`` computing ``cat([l(x) for l in layers], -1)`` with one GEMM, or None.

    For projections that read the same input (q/k/v, gate/up): one launch instead of
    several, and a wider GEMM that uses the GPU better. Only plain (unquantized) weights of
    one dtype and device merge, all with or all without bias. The merged weight is one
    tensor; each original layer's weight becomes a view of its rows, so memory is not
    doubled and the originals still work.
    """
    first = layers[0]
    plain = all(
        type(layer.quant_method) is UnquantizedLinearMethod
        and type(layer).forward is Linear.forward
        and layer.input_size == first.input_size
        for layer in layers
    )
    if not plain or len({(layer.bias is None) for layer in layers}) != 1:
        return None
    weights = [_tensor(layer.weight) for layer in layers]
    if len({(w.dtype, w.device) for w in weights}) != 1:
        return None
    out_size = sum(layer.output_size for layer in layers)
    merged = Linear.__new__(Linear)
    torch.nn.Module.__init__(merged)
    merged.input_size, merged.output_size = first.input_size, out_size
    merged.prefix = "+".join(layer.prefix for layer in layers)
    merged.quant_method = UnquantizedLinearMethod()
    weight = torch.cat([w.data for w in weights], dim=0)
    merged.register_parameter("weight", torch.nn.Parameter(weight, requires_grad=False))
    bias = None
    if first.bias is not None:
        biases = [_tensor(layer.bias).data for layer in layers]
        bias = torch.nn.Parameter(torch.cat(biases), requires_grad=False)
    merged.register_parameter("bias", bias)
    row = 0
    for layer in layers:
        rows = slice(row, row + layer.output_size)
        layer.weight = torch.nn.Parameter(weight[rows], requires_grad=False)
        if bias is not None:
            layer.bias = torch.nn.Parameter(bias.data[rows], requires_grad=False)
        row += layer.output_size
    return merged


def _tensor(value: object) -> torch.Tensor:
    assert isinstance(value, torch.Tensor)
    return value
