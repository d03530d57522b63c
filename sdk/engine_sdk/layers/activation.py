"""Gated MLP: ``down(act(gate(x)) * up(x))``, the Llama / Qwen / Gemma feed-forward block.

``act`` is SiLU (Llama, Qwen, Phi-3, Mistral: fused on CUDA) or GELU with the tanh
approximation (Gemma's ``gelu_pytorch_tanh``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from engine_sdk.layers import fused_ops
from engine_sdk.layers.linear import Linear, merge_linears
from engine_sdk.layers.lora import lora_expand

if TYPE_CHECKING:
    from engine_sdk.interfaces.quantization import QuantizationConfig
    from engine_sdk.layers.gemv import LoRAEpilogue

__all__ = ["GATED_ACTIVATIONS", "GatedMLP", "act_and_mul", "check_gated_activation", "silu_and_mul"]

# HF ``hidden_act`` / ``hidden_activation`` names a gated MLP computes.
GATED_ACTIVATIONS = ("silu", "gelu_pytorch_tanh", "gelu_tanh")


def silu_and_mul(gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
    if fused_ops.enabled(gate):
        return fused_ops.silu_and_mul(gate, up)
    return torch.nn.functional.silu(gate) * up


def check_gated_activation(hidden_act: str) -> None:
    if hidden_act not in GATED_ACTIVATIONS:
        raise ValueError(
            f"hidden_act {hidden_act!r} is not supported by the gated MLP; supported: "
            f"{', '.join(GATED_ACTIVATIONS)}"
        )


def act_and_mul(gate: torch.Tensor, up: torch.Tensor, hidden_act: str = "silu") -> torch.Tensor:
    """``act(gate) * up`` for a name of ``GATED_ACTIVATIONS``."""
    if hidden_act == "silu":
        return silu_and_mul(gate, up)
    return torch.nn.functional.gelu(gate, approximate="tanh") * up


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
        check_gated_activation(hidden_act)
        self.hidden_act = hidden_act

        def linear(name: str, n_in: int, n_out: int) -> Linear:
            return Linear(n_in, n_out, bias, quant_config, f"{prefix}.{name}", params_dtype)

        self.gate_proj = linear("gate_proj", hidden_size, intermediate_size)
        self.up_proj = linear("up_proj", hidden_size, intermediate_size)
        self.down_proj = linear("down_proj", intermediate_size, hidden_size)
        self.gate_up_proj: Linear | None = None  # set by merge_projections()

    def merge_projections(self) -> None:
        """After loading: gate and up as one GEMM (when their quantization method can merge)."""
        self.gate_up_proj = merge_linears([self.gate_proj, self.up_proj])

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.gate_up_proj is not None:
            return self.forward_gate_up(self.gate_up_proj(x))
        hidden = act_and_mul(self.gate_proj(x), self.up_proj(x), self.hidden_act)
        out: torch.Tensor = self.down_proj(hidden)
        return out

    def forward_gate_up(
        self, gate_up: torch.Tensor, gate_up_lora: LoRAEpilogue | None = None
    ) -> torch.Tensor:
        """The rest of ``forward`` from the merged gate/up output (a caller that computed
        it with a fused kernel continues here). ``gate_up_lora``: the gate/up adapter's
        expand, not yet in ``gate_up`` (``Linear.lora_add_rms_norm_deferred``): the
        activation's kernel adds it, or the separate expand does first."""
        if self.hidden_act == "silu" and gate_up.dim() == 2:
            # decode with adapters: the down projection's shrink rides in the activation
            fused = self.down_proj.lora_silu_and_mul(gate_up, gate_up_lora)
            if fused is not None:
                return fused
        if gate_up_lora is not None:  # no kernel to take it: the expand on its own
            assert self.gate_up_proj is not None and self.gate_up_proj.lora is not None
            lora_expand(
                gate_up,
                gate_up_lora.parts.sum(0),
                gate_up_lora.lora_b,
                gate_up_lora.slots,
                self.gate_up_proj.lora.slices,
            )
        if self.hidden_act != "silu":
            gate, up = gate_up.chunk(2, dim=-1)
            hidden = act_and_mul(gate, up, self.hidden_act)
        elif fused_ops.enabled(gate_up):
            hidden = fused_ops.silu_and_mul_merged(gate_up)
        else:
            gate, up = gate_up.chunk(2, dim=-1)
            hidden = torch.nn.functional.silu(gate) * up
        out: torch.Tensor = self.down_proj(hidden)
        return out
