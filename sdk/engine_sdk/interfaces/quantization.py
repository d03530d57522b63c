"""The quantization contract: a config that picks a per-layer method, and the method.

A ``QuantizationConfig`` is parsed from a checkpoint's ``quantization_config`` (or built for
``--quantization NAME``). For each linear layer the engine asks ``get_method(prefix)``; the
returned ``QuantizationMethod`` creates that layer's parameters, post-processes them once the
checkpoint is loaded, and computes the layer's output.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
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


class QuantizationConfig(ABC):
    """Parsed quantization settings of one model."""

    name: ClassVar[str] = ""

    @classmethod
    @abstractmethod
    def from_config(cls, config: dict[str, Any]) -> QuantizationConfig:
        """Build from the checkpoint's ``quantization_config`` dict (``{}`` for online)."""

    @abstractmethod
    def get_method(self, prefix: str) -> QuantizationMethod | None:
        """The method for the linear layer at ``prefix``; ``None`` keeps it unquantized."""

    def check_device(self, device: torch.device) -> str | None:
        """``None`` when the method can run on ``device``, else the reason it cannot."""
        return None
