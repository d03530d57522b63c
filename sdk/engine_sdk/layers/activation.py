"""Gated MLP: ``down(silu(gate(x)) * up(x))``, the Llama / Qwen feed-forward block."""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from engine_sdk.layers import fused_ops
from engine_sdk.layers.linear import Linear

if TYPE_CHECKING:
    from engine_sdk.interfaces.quantization import QuantizationConfig

__all__ = ["GatedMLP", "silu_and_mul"]


def silu_and_mul(gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
    if fused_ops.enabled(gate):
        return fused_ops.silu_and_mul(gate, up)
    return torch.nn.functional.silu(gate) * up


class GatedMLP(torch.nn.Module):
    """Projections named as in HF checkpoints: ``gate_proj``, ``up_proj``, ``down_proj``."""

    def __init__(
        self,
        hidden_size: int,
        intermediate_size: int,
        hidden_act: str = "silu",
        bias: bool = False,
        quant_config: QuantizationConfig | None = None,
        prefix: str = "",
        params_dtype: torch.dtype | None = None,
    ) -> None:
        super().__init__()
        if hidden_act != "silu":
            raise ValueError(f"hidden_act {hidden_act!r} is not supported; only 'silu' is")

        def linear(name: str, n_in: int, n_out: int) -> Linear:
            return Linear(n_in, n_out, bias, quant_config, f"{prefix}.{name}", params_dtype)

        self.gate_proj = linear("gate_proj", hidden_size, intermediate_size)
        self.up_proj = linear("up_proj", hidden_size, intermediate_size)
        self.down_proj = linear("down_proj", intermediate_size, hidden_size)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out: torch.Tensor = self.down_proj(silu_and_mul(self.gate_proj(x), self.up_proj(x)))
        return out
