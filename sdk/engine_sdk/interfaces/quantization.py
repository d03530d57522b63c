"""The quantization contract: a config that picks a per-layer method, and the method.

A ``QuantizationConfig`` is parsed from a checkpoint's ``quantization_config`` (or built for
``--quantization NAME``). For each linear layer the engine asks ``get_method(prefix)``; the
returned ``QuantizationMethod`` creates that layer's parameters, post-processes them once the
checkpoint is loaded, and computes the layer's output. Once every layer is processed, models
merge projections that read the same input (q/k/v, gate/up) into one layer; a method takes
part by implementing :meth:`QuantizationMethod.merge`.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Sequence
from typing import Any, ClassVar

import torch


class QuantizationMethod(ABC):
    """How one linear layer stores and applies its weights."""

    @abstractmethod
    def create_weights(
        self,
        layer: torch.nn.Module,
        input_size: int,
        output_size: int,
        params_dtype: torch.dtype,
    ) -> None:
        """Register the layer's parameters (``layer.register_parameter``)."""

    def process_weights_after_loading(self, layer: torch.nn.Module) -> None:  # noqa: B027
        """Repack or convert weights once every tensor of the layer is loaded."""

    @abstractmethod
    def apply(
        self, layer: torch.nn.Module, x: torch.Tensor, bias: torch.Tensor | None = None
    ) -> torch.Tensor:
        """Compute ``x @ W.T + bias`` with the layer's stored weights."""

    def apply_add_rms_norm(
        self,
        layer: torch.nn.Module,
        x: torch.Tensor,
        residual: torch.Tensor,
        norm_weight: torch.Tensor,
        eps: float,
        bias: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor] | None:
        """Optional decode fusion: ``(apply(rms_norm(x + residual) * norm_weight), x +
        residual)`` in one kernel, for ``x`` and ``residual`` [M, K] and ``norm_weight`` [K].

        The SDK decoder offers it where an RMSNorm feeds this layer (q/k/v after the input
        norm, gate/up after the post-attention norm) and the layer runs nothing but this
        method in the step; it saves the norm's launch at decode. Return ``None`` for a
        call the method does not fuse (the default: every call); the decoder then runs its
        add+norm kernel and :meth:`apply`. The results must equal that path's: the sum
        rounded to the dtype (it is the new residual, returned in a new tensor), the
        normalized value rounded, then times ``norm_weight``, rounded.
        """
        return None

    def apply_add_rms_norm_silu(
        self,
        layer: torch.nn.Module,
        x: torch.Tensor,
        residual: torch.Tensor,
        norm_weight: torch.Tensor,
        eps: float,
        bias: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor] | None:
        """Optional decode fusion for a merged ``[gate | up]`` layer (``2 * I`` output
        rows, gate first): ``(silu(gate) * up, x + residual)`` with ``gate | up =
        apply(rms_norm(x + residual) * norm_weight)``, in one kernel.

        The SDK decoder offers it before a SiLU-gated MLP whose merged gate/up layer runs
        nothing but this method in the step, ahead of :meth:`apply_add_rms_norm`. Return
        ``None`` for a call the method does not fuse (the default); the decoder then tries
        :meth:`apply_add_rms_norm` and its own SiLU-and-mul kernel. Roundings as there,
        plus gate and up each rounded to the dtype before ``silu(gate) * up`` in float32,
        rounded once.
        """
        return None

    def merge(
        self, layers: Sequence[torch.nn.Module], merged: torch.nn.Module
    ) -> QuantizationMethod | None:
        """Fill ``merged`` so that it computes ``cat([layer(x) for layer in layers], -1)``.

        Optional; the default returns ``None``: these layers cannot merge and each keeps its
        own matmul. ``merge_linears`` (``engine_sdk.layers.linear``) calls it on the first
        layer's method after loading and ``process_weights_after_loading``, once it has
        checked that every layer has a method of this same class, the same input size and
        all or none a bias. ``merged`` is a fresh ``Linear`` with ``input_size``,
        ``output_size`` (the sum) and ``prefix`` set and no parameters; the bias is merged
        by the caller after this returns.

        An implementation checks what its own layout needs (equal group sizes, equal
        static scales, matching devices, ...) and returns ``None`` *before changing
        anything* when the layers do not fit. Otherwise it registers on ``merged`` the
        layers' parameters concatenated along the output dimension (in the order given),
        in their final processed form (``process_weights_after_loading`` is not called on
        ``merged``), sets any attributes its ``apply`` reads, and returns the method that
        applies them (``self``, or another instance when the merged layout differs, e.g.
        per-tensor scales become one per-channel vector). The original layers must stay
        usable: point their parameters at views of the merged tensors
        (``engine_sdk.layers.linear.share_merged``) so the memory is not doubled.
        """
        return None


class QuantizationConfig(ABC):
    """Parsed quantization settings of one model."""

    name: ClassVar[str] = ""
    #: Set (on the instance) when the checkpoint asks for the reference path on a GPU
    #: below the spec's ``min_capability`` (correct, slower); the core then accepts such a
    #: GPU instead of refusing it from the spec's data.
    allow_reference: bool = False

    @classmethod
    @abstractmethod
    def from_config(cls, config: dict[str, Any]) -> QuantizationConfig:
        """Build from the checkpoint's ``quantization_config`` dict (``{}`` for online)."""

    @abstractmethod
    def get_method(self, prefix: str) -> QuantizationMethod | None:
        """The method for the linear layer at ``prefix``; ``None`` keeps it unquantized."""

    def check_device(self, device: torch.device) -> str | None:
        """``None`` when the method can run on ``device``, else the reason it cannot.

        Optional, for what the spec's data cannot say (a kernel library that must import).
        The core has already checked the spec's ``devices``, ``min_capability`` and
        ``reference_devices`` before it calls this.
        """
        return None
