"""The attention layer models use: owns one backend instance built by the engine.

The model computes q/k/v (with rope); this layer reshapes them into heads and hands them,
with the layer's KV cache tensor and the step's shared metadata, to the backend the
engine chose (``ctx.make_attention``). It has no parameters.
"""

from __future__ import annotations

import torch

from engine_sdk.interfaces.attention import AttentionBackend, AttentionLayerConfig
from engine_sdk.interfaces.model import ModelContext

__all__ = ["Attention"]


class Attention(torch.nn.Module):
    def __init__(
        self,
        ctx: ModelContext,
        num_heads: int,
        num_kv_heads: int,
        head_dim: int,
        scale: float | None = None,
        sliding_window: int | None = None,
        prefix: str = "",
    ) -> None:
        super().__init__()
        if num_heads % num_kv_heads != 0:
            raise ValueError(
                f"{prefix}: num_heads ({num_heads}) must be a multiple of "
                f"num_kv_heads ({num_kv_heads})"
            )
        self.num_heads = num_heads
        self.num_kv_heads = num_kv_heads
        self.head_dim = head_dim
        self.prefix = prefix
        self.config = AttentionLayerConfig(
            num_heads=num_heads,
            num_kv_heads=num_kv_heads,
            head_dim=head_dim,
            scale=scale if scale is not None else head_dim**-0.5,
            block_size=ctx.block_size,
            dtype=ctx.dtype,
            kv_cache_dtype=ctx.kv_cache_dtype,
            sliding_window=sliding_window,
        )
        self.backend: AttentionBackend = ctx.make_attention(self.config)

    def forward(
        self,
        query: torch.Tensor,
        key: torch.Tensor,
        value: torch.Tensor,
        kv_cache: torch.Tensor,
        attn_metadata: object,
    ) -> torch.Tensor:
        """q [num_tokens, heads * head_dim], k/v [num_tokens, kv_heads * head_dim]."""
        num_tokens = query.shape[0]
        q = query.view(num_tokens, self.num_heads, self.head_dim)
        k = key.view(num_tokens, self.num_kv_heads, self.head_dim)
        v = value.view(num_tokens, self.num_kv_heads, self.head_dim)
        return self.backend.forward(q, k, v, kv_cache, attn_metadata)
