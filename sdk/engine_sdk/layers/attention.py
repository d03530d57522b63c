"""The attention layer models use: owns one backend instance built by the engine.

The model computes q/k/v (with rope); this layer reshapes them into heads and hands them,
with the layer's KV cache tensor and the step's shared metadata, to the backend the
engine chose (``ctx.make_attention``). It has no parameters.

fp8 KV cache scales in a checkpoint are routed here by ``load_kv_scale``. Layouts read
(the names vLLM accepts): ``<attn>.k_scale`` / ``<attn>.v_scale`` (llm-compressor,
vLLM), ``<attn>.k_proj.k_scale`` / ``<attn>.v_proj.v_scale`` (ModelOpt) and the older
``<attn>.kv_scale`` (one scale for both), where ``<attn>`` is the attention block
(``model.layers.N.self_attn``) or this layer inside it (``...self_attn.attn``). A vector
(per-head) scale is reduced to its maximum, which never clips more than the per-head ones.
"""

from __future__ import annotations

import os

import torch

from engine_sdk.interfaces.attention import AttentionBackend, AttentionLayerConfig, KVStoreTarget
from engine_sdk.interfaces.model import ModelContext

__all__ = ["KV_SCALE_SUFFIXES", "Attention", "load_kv_scale"]

KV_SCALE_SUFFIXES = (".k_scale", ".v_scale", ".kv_scale")
# The decoder writes K/V into the cache inside its fused q/k/v kernel where the backend
# offers a target; 0: always through the backend's forward (A/B measurements).
_FUSED_KV_STORE = os.environ.get("ENGINE_FUSED_KV_STORE", "1") != "0"


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
        logits_soft_cap: float | None = None,
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
            logits_soft_cap=logits_soft_cap,
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

    def kv_store_target(
        self, kv_cache: torch.Tensor, attn_metadata: object
    ) -> KVStoreTarget | None:
        """Where the caller may write this step's K/V itself (``None``: pass them to
        ``forward``); ``ENGINE_FUSED_KV_STORE=0`` always says ``None``."""
        if not _FUSED_KV_STORE:
            return None
        return self.backend.kv_store_target(kv_cache, attn_metadata)

    def forward_stored(
        self, query: torch.Tensor, kv_cache: torch.Tensor, attn_metadata: object
    ) -> torch.Tensor:
        """``forward`` after the caller wrote K/V where ``kv_store_target`` said."""
        q = query.view(query.shape[0], self.num_heads, self.head_dim)
        return self.backend.forward_stored(q, kv_cache, attn_metadata)

    def load_kv_scale(self, which: str, tensor: torch.Tensor) -> None:
        """Set this layer's fp8 KV cache scale from a checkpoint: ``which`` k, v or kv."""
        if tensor.numel() == 0:
            raise ValueError(f"{self.prefix}: the checkpoint's {which}_scale is empty")
        value = float(tensor.detach().float().max())
        k_scale = value if which in ("k", "kv") else None
        v_scale = value if which in ("v", "kv") else None
        try:
            self.backend.set_kv_scales(k_scale, v_scale)
        except ValueError as exc:
            raise ValueError(f"{self.prefix}: checkpoint {which}_scale: {exc}") from exc


def load_kv_scale(model: torch.nn.Module, name: str, tensor: torch.Tensor) -> None:
    """Route checkpoint tensor ``name`` (ending in a ``KV_SCALE_SUFFIXES`` entry) to its layer.

    ``model.layers.0.self_attn.k_proj.k_scale`` -> the ``Attention`` at
    ``model.layers.0.self_attn`` or ``model.layers.0.self_attn.attn``; raises ``ValueError``
    naming the tensor when there is none.
    """
    base, _, leaf = name.rpartition(".")
    which = leaf.removesuffix("_scale")
    if base.endswith((".k_proj", ".v_proj")):
        base = base.rpartition(".")[0]
    for path in (base, f"{base}.attn"):
        try:
            module = model.get_submodule(path)
        except AttributeError:
            continue
        if isinstance(module, Attention):
            module.load_kv_scale(which, tensor)
            return
    raise ValueError(
        f"checkpoint tensor {name!r} is an fp8 KV cache scale, but {type(model).__name__} has "
        f"no attention layer at {base!r} or {base + '.attn'!r}; is the checkpoint for a "
        "different architecture?"
    )
