"""A linear layer whose weights and matmul come from a ``QuantizationMethod``.

Models build every projection as ``Linear(in, out, bias, quant_config, prefix)``; the
layer asks ``quant_config.get_method(prefix)`` (``prefix`` is the HF module name, such as
``model.layers.0.self_attn.q_proj``) and falls back to :class:`UnquantizedLinearMethod`.
Parameter names are the checkpoint's (``weight``, ``bias``, or whatever the method
registers, e.g. ``weight_scale``), so the generic weight loader copies them by name.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

import torch

from engine_sdk.interfaces.quantization import QuantizationMethod
from engine_sdk.layers import gemv
from engine_sdk.layers.lora import shrink_in_gemv

if TYPE_CHECKING:
    from engine_sdk.interfaces.quantization import QuantizationConfig
    from engine_sdk.layers.lora import LoRALayer

__all__ = [
    "Linear",
    "UnquantizedLinearMethod",
    "is_method_only",
    "is_plain_linear",
    "merge_linears",
    "share_merged",
]


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
        if gemv.use_gemv(x, weight):  # a few rows (decode): the weight read is the cost
            return gemv.gemv(x, weight, bias)
        return torch.nn.functional.linear(x, weight, bias)

    def apply_add_rms_norm(
        self,
        layer: torch.nn.Module,
        x: torch.Tensor,
        residual: torch.Tensor,
        norm_weight: torch.Tensor,
        eps: float,
        bias: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor] | None:
        """``gemv.gemv_add_rms_norm`` where it runs (a few rows on CUDA, rows of at most
        ``gemv.NORM_MAX_K``), else None."""
        weight: torch.Tensor = layer.weight  # type: ignore[assignment]
        if not gemv.use_gemv_add_rms_norm(x, residual, weight):
            return None
        return gemv.gemv_add_rms_norm(x, residual, norm_weight, eps, weight, bias)

    def apply_add_rms_norm_silu(
        self,
        layer: torch.nn.Module,
        x: torch.Tensor,
        residual: torch.Tensor,
        norm_weight: torch.Tensor,
        eps: float,
        bias: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor] | None:
        """The gated ``gemv.gemv_add_rms_norm`` where it runs, else None."""
        weight: torch.Tensor = layer.weight  # type: ignore[assignment]
        if weight.shape[0] % 2 or not gemv.use_gemv_add_rms_norm(x, residual, weight):
            return None
        return gemv.gemv_add_rms_norm(x, residual, norm_weight, eps, weight, bias, gated=True)

    def merge(
        self, layers: Sequence[torch.nn.Module], merged: torch.nn.Module
    ) -> QuantizationMethod | None:
        """One weight [sum of outputs, in] when the weights share a dtype and device."""
        weights = [_tensor(layer.weight) for layer in layers]
        if len({(w.dtype, w.device) for w in weights}) != 1:
            return None
        weight = torch.cat([w.data for w in weights], dim=0)
        merged.register_parameter("weight", torch.nn.Parameter(weight, requires_grad=False))
        share_merged(layers, "weight", weight)
        return UnquantizedLinearMethod()


class Linear(torch.nn.Module):
    """``y = x @ W.T + b`` with ``W`` stored and applied by the layer's quantization method.

    With LoRA on, the engine sets ``lora`` (:class:`~engine_sdk.layers.lora.LoRALayer`) on
    the layers adapters target and ``forward`` adds each token's adapter delta. ``parts``
    names the HF modules this layer computes, with their output sizes: one for a plain
    layer, one per merged projection for ``merge_linears``' result.
    """

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
        self.parts: tuple[tuple[str, int], ...] = ((prefix, output_size),)
        self.lora: LoRALayer | None = None
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
        lora = self.lora
        if lora is None or not lora.context.active:
            return self.quant_method.apply(self, x, self.bias)
        weight = self.weight if self.has_plain_weight else None
        if (
            isinstance(weight, torch.Tensor)
            and gemv.use_gemv(x, weight)
            and lora.fuses_into_gemv(x)
        ):
            # decode: the expand rides in the GEMV's epilogue (one launch for the adapter,
            # none with the shrink inside the GEMV's launch)
            epilogue = lora.epilogue_in_gemv(x) if shrink_in_gemv() else lora.epilogue(x)
            return gemv.gemv(x, weight, self.bias, lora=epilogue)
        return lora.apply(x, self.quant_method.apply(self, x, self.bias))

    @property
    def has_plain_weight(self) -> bool:
        """Whether the weight is a plain ``[out, in]`` tensor (``UnquantizedLinearMethod``)."""
        return type(self.quant_method) is UnquantizedLinearMethod

    def lora_add_rms_norm(
        self, x: torch.Tensor, residual: torch.Tensor, norm_weight: torch.Tensor, eps: float
    ) -> tuple[torch.Tensor, torch.Tensor] | None:
        """``(self(rms_norm(x + residual) * norm_weight), x + residual)`` with the adapters
        of this step as two kernels (``gemv.gemv_add_rms_norm`` with the LoRA expand in
        its epilogue, after the shrink that normalizes the rows itself), or None where
        that does not run: no adapter in the step, a quantized or subclassed layer, rows
        the GEMV leaves to the library GEMM, or the LoRA kernels off."""
        lora = self._norm_gemv_lora(x, residual)
        if lora is None:
            return None
        weight: torch.Tensor = self.weight  # type: ignore[assignment]
        if shrink_in_gemv():
            epilogue = lora.epilogue_in_gemv(x)
        else:
            epilogue = lora.epilogue_add_rms_norm(x, residual, norm_weight, eps)
        return gemv.gemv_add_rms_norm(x, residual, norm_weight, eps, weight, self.bias, epilogue)

    def lora_add_rms_norm_deferred(
        self, x: torch.Tensor, residual: torch.Tensor, norm_weight: torch.Tensor, eps: float
    ) -> tuple[torch.Tensor, torch.Tensor, gemv.LoRAEpilogue] | None:
        """``lora_add_rms_norm`` without the expand: ``(base output, x + residual, what
        the next kernel needs to add the expand)``, the shrink written by the GEMV's own
        first programs (``LoRALayer.deferred_add_rms_norm``); None where that does not run
        (the conditions of ``lora_add_rms_norm``)."""
        lora = self._norm_gemv_lora(x, residual)
        if lora is None:
            return None
        weight: torch.Tensor = self.weight  # type: ignore[assignment]
        pending = lora.deferred_add_rms_norm(x)
        out, new_residual = gemv.gemv_add_rms_norm(
            x, residual, norm_weight, eps, weight, self.bias, pending
        )
        return out, new_residual, pending

    def lora_silu_and_mul(
        self, gate_up: torch.Tensor, gate_up_lora: gemv.LoRAEpilogue | None = None
    ) -> torch.Tensor | None:
        """``self(silu(gate) * up)`` of a merged ``gate_up`` [M, 2 * in] with the adapters of
        this step as two kernels (the activation with the shrink, then ``gemv.gemv`` with
        the expand in its epilogue), or None where that does not run (the conditions of
        ``lora_add_rms_norm``). ``gate_up_lora``: the gate/up adapter's expand, still to
        be added to ``gate_up`` (``lora_add_rms_norm_deferred``), added by the first kernel."""
        lora = self._fusable_lora()
        if lora is None:
            return None
        weight: torch.Tensor = self.weight  # type: ignore[assignment]
        if gate_up.dim() != 2 or gate_up.shape[1] != 2 * weight.shape[1]:
            return None
        rows = gate_up[:, : weight.shape[1]]  # the activation's shape, for the checks
        if not gemv.use_gemv(rows, weight) or not lora.fuses_into_gemv(rows):
            return None
        act, epilogue = lora.epilogue_silu_and_mul(gate_up, gate_up_lora)
        return gemv.gemv(act, weight, self.bias, lora=epilogue)

    def _norm_gemv_lora(self, x: torch.Tensor, residual: torch.Tensor) -> LoRALayer | None:
        """The adapter layer where the fused add+RMSNorm GEMV may run this layer with its
        adapters (``_fusable_lora``, rows the GEMV takes, the LoRA kernels on); else None."""
        lora = self._fusable_lora()
        if lora is None:
            return None
        weight: torch.Tensor = self.weight  # type: ignore[assignment]
        if not gemv.use_gemv_add_rms_norm(x, residual, weight) or not lora.fuses_into_gemv(x):
            return None
        return lora

    def _fusable_lora(self) -> LoRALayer | None:
        """The adapter layer when a fused LoRA decode path may stand in for ``forward``: an
        unquantized weight and ``Linear``'s own forward; else None."""
        lora = self.lora
        if lora is None or type(self).forward is not Linear.forward or not self.has_plain_weight:
            return None
        return lora

    def extra_repr(self) -> str:
        method = type(self.quant_method).__name__
        return f"in={self.input_size}, out={self.output_size}, method={method}"


def is_method_only(layer: torch.nn.Module | None) -> bool:
    """Whether ``layer(x)`` is just its quantization method's ``apply`` in this step: a
    ``Linear`` with its own forward and no adapter token in the step (no LoRA, or LoRA
    whose context is inactive: a base-only step or a CUDA graph captured for one). A
    fused decode kernel (``QuantizationMethod.apply_add_rms_norm``) may then stand in for
    the norm before it and the layer."""
    return (
        isinstance(layer, Linear)
        and type(layer).forward is Linear.forward
        and (layer.lora is None or not layer.lora.context.active)
    )


def is_plain_linear(layer: torch.nn.Module | None) -> bool:
    """Whether ``layer(x)`` is just ``x @ layer.weight.T + layer.bias`` in this step:
    :func:`is_method_only` with an unquantized weight, which a fused kernel may read
    itself."""
    return isinstance(layer, Linear) and is_method_only(layer) and layer.has_plain_weight


def merge_linears(layers: list[Linear]) -> Linear | None:
    """One ``Linear`` computing ``cat([l(x) for l in layers], -1)`` with one GEMM, or None.

    For projections that read the same input (q/k/v, gate/up): one launch instead of
    several, and a wider GEMM that uses the GPU better. The layers must share the input
    size, all or none have a bias, and use quantization methods of one class; that method's
    :meth:`~engine_sdk.interfaces.quantization.QuantizationMethod.merge` builds the merged
    weights or refuses (plain weights merge when they share a dtype and device). Each
    original layer's tensors become views of the merged ones where the method can, so
    memory is not doubled and the originals still work.
    """
    first = layers[0]
    method_cls = type(first.quant_method)
    compatible = all(
        type(layer.quant_method) is method_cls
        and type(layer).forward is Linear.forward
        and layer.input_size == first.input_size
        for layer in layers
    )
    if not compatible or not isinstance(first.quant_method, QuantizationMethod):
        return None
    biases = [layer.bias for layer in layers]
    if any(b is None for b in biases) and any(b is not None for b in biases):
        return None
    if first.bias is not None and len({(_tensor(b).dtype, _tensor(b).device) for b in biases}) != 1:
        return None
    merged = Linear.__new__(Linear)
    torch.nn.Module.__init__(merged)
    merged.input_size = first.input_size
    merged.output_size = sum(layer.output_size for layer in layers)
    merged.prefix = "+".join(layer.prefix for layer in layers)
    merged.parts = tuple(part for layer in layers for part in layer.parts)
    merged.lora = None
    method = first.quant_method.merge(layers, merged)
    if method is None:
        return None
    merged.quant_method = method
    bias = None
    if first.bias is not None:
        bias = torch.nn.Parameter(torch.cat([_tensor(b).data for b in biases]), requires_grad=False)
        share_merged(layers, "bias", bias.data)
    merged.register_parameter("bias", bias)
    return merged


def share_merged(
    layers: Sequence[torch.nn.Module],
    name: str,
    merged: torch.Tensor,
    dim: int = 0,
    sizes: Sequence[int] | None = None,
) -> None:
    """Point each layer's parameter ``name`` at its slice of ``merged`` along ``dim``.

    ``sizes`` are the slices' lengths in layer order (default: each layer's
    ``output_size``, for tensors whose ``dim`` is the output dimension). For a merged
    weight [N, K] and ``dim=0`` the views are contiguous row blocks; along ``dim=1`` of a
    row-major tensor they are strided column blocks, which the method's ``apply`` must
    accept::

        merged [K, N1+N2+N3]  ->  layer 1: [:, 0:N1]  layer 2: [:, N1:N1+N2]  ...
    """
    if sizes is None:
        sizes = [_output_size(layer) for layer in layers]
    assert len(sizes) == len(layers) and sum(sizes) == merged.shape[dim]
    for layer, view in zip(layers, torch.split(merged, list(sizes), dim=dim), strict=True):
        setattr(layer, name, torch.nn.Parameter(view, requires_grad=False))


def _output_size(layer: torch.nn.Module) -> int:
    size = layer.output_size
    assert isinstance(size, int)
    return size


def _tensor(value: object) -> torch.Tensor:
    assert isinstance(value, torch.Tensor)
    return value
