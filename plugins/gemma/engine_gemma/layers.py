"""Gemma's building blocks: the ``1 + w`` RMSNorm and the attention with its own scale.

HF Gemma norms keep ``weight`` as an offset from one and multiply in float32 before the
cast back (Llama casts first); the attention scale is ``query_pre_attn_scalar ** -0.5``
rather than ``head_dim ** -0.5``; Gemma 2 soft-caps the attention scores; each layer is
sliding-window or global after ``config.layer_types``.
"""

from __future__ import annotations

from typing import Any

import torch
from engine_sdk.interfaces.model import ModelContext
from engine_sdk.layers.attention import Attention
from engine_sdk.layers.decoder import DecoderAttention
from engine_sdk.layers.norm import RMSNorm

__all__ = ["GemmaAttention", "GemmaRMSNorm", "layer_type_of"]


class GemmaRMSNorm(RMSNorm):
    """``x / sqrt(mean(x^2) + eps) * (1 + weight)`` in float32, then cast to x's dtype."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x32 = x.to(torch.float32)
        x32 = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + self.eps)
        return (x32 * (1.0 + self.weight.float())).to(x.dtype)

    def add_forward(
        self, x: torch.Tensor, residual: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        summed = x + residual  # never the fused Llama kernel: its weight is not 1 + w
        return self.forward(summed), summed


def layer_type_of(hf_config: Any, layer_idx: int) -> str:
    """``sliding_attention`` or ``full_attention``: ``config.layer_types`` when present,
    else Gemma's pattern (every ``sliding_window_pattern``-th layer global; 2 for Gemma 2)."""
    layer_types = getattr(hf_config, "layer_types", None)
    if layer_types is not None:
        return str(layer_types[layer_idx])
    pattern = int(getattr(hf_config, "sliding_window_pattern", None) or 2)
    return "sliding_attention" if (layer_idx + 1) % pattern else "full_attention"


class GemmaAttention(DecoderAttention):
    """The generic decoder attention with Gemma's norm, scale, soft cap and window."""

    def make_norm(self, size: int, eps: float, dtype: torch.dtype) -> RMSNorm:
        return GemmaRMSNorm(size, eps, dtype)

    def make_attention(self, ctx: ModelContext, layer_idx: int, prefix: str) -> Attention:
        cfg = ctx.hf_config
        scalar = getattr(cfg, "query_pre_attn_scalar", None) or self.head_dim
        sliding = layer_type_of(cfg, layer_idx) == "sliding_attention"
        window = getattr(cfg, "sliding_window", None)
        cap = getattr(cfg, "attn_logit_softcapping", None)
        return Attention(
            ctx,
            self.num_heads,
            self.num_kv_heads,
            self.head_dim,
            scale=float(scalar) ** -0.5,
            sliding_window=int(window) if sliding and window else None,
            prefix=prefix,
            logits_soft_cap=float(cap) if cap else None,
        )
