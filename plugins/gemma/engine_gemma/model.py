"""Gemma2ForCausalLM and Gemma3ForCausalLM (text only), on the SDK's decoder pieces::

    embed * sqrt(hidden) -> [ x + post_attn_norm(attn(input_norm(x)))          ] x N
                            [ x + post_ff_norm(gelu_tanh_mlp(pre_ff_norm(x)))   ]
                         -> norm -> lm_head -> (Gemma 2) cap * tanh(logits / cap)

Sliding-window and global layers alternate after ``config.layer_types``, each with its own
rope (Gemma 3: ``rope_parameters`` per layer type, e.g. theta 10k local and 1M global with
linear scaling); Gemma 3 adds RMSNorm on q and k. Norm weights are ``1 + w``.
"""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any, ClassVar

import torch
from engine_sdk.interfaces.model import ModelArchitecture, ModelContext
from engine_sdk.layers.activation import GatedMLP
from engine_sdk.layers.decoder import DecoderForCausalLM, DecoderOptions, head_dim_of
from engine_sdk.layers.embedding import LMHead, VocabEmbedding
from engine_sdk.layers.parallel import (
    ParallelGatedMLP,
    ParallelLMHead,
    VocabParallelEmbedding,
    current_tensor_parallel,
)
from engine_sdk.layers.rotary import RopeParameters, RotaryEmbedding, rope_parameters_from_config

from engine_gemma.layers import GemmaAttention, GemmaRMSNorm, layer_type_of

__all__ = ["Gemma2ForCausalLM", "Gemma3ForCausalLM"]


def rope_for_layer_type(hf_config: Any, layer_type: str, head_dim: int) -> RopeParameters:
    """Rope of one layer type: transformers 5 nests ``rope_parameters`` per layer type
    (Gemma 3); 4.x configs give the local layers ``rope_local_base_freq`` unscaled."""
    params = getattr(hf_config, "rope_parameters", None)
    max_pos = getattr(hf_config, "max_position_embeddings", 2048)
    if isinstance(params, dict) and isinstance(params.get(layer_type), dict):
        shim = SimpleNamespace(rope_parameters=params[layer_type], max_position_embeddings=max_pos)
        return rope_parameters_from_config(shim, head_dim)
    local_base = getattr(hf_config, "rope_local_base_freq", None)
    if layer_type == "sliding_attention" and local_base is not None:
        shim = SimpleNamespace(rope_theta=local_base, max_position_embeddings=max_pos)
        return rope_parameters_from_config(shim, head_dim)
    return rope_parameters_from_config(hf_config, head_dim)


class GemmaDecoderLayer(torch.nn.Module):
    def __init__(self, ctx: ModelContext, options: DecoderOptions, layer_idx: int, prefix: str):
        super().__init__()
        cfg, dtype = ctx.hf_config, ctx.dtype
        hidden, eps = int(cfg.hidden_size), float(cfg.rms_norm_eps)
        self.layer_type = layer_type_of(cfg, layer_idx)
        self.self_attn = GemmaAttention(ctx, options, layer_idx, f"{prefix}.self_attn")
        tp = current_tensor_parallel()
        act = getattr(cfg, "hidden_activation", None) or getattr(cfg, "hidden_act", "gelu_tanh")
        mlp_args = (hidden, int(cfg.intermediate_size), act, False, ctx.quant_config)
        self.mlp: GatedMLP | ParallelGatedMLP = (
            GatedMLP(*mlp_args, f"{prefix}.mlp", dtype)
            if tp is None
            else ParallelGatedMLP(*mlp_args, f"{prefix}.mlp", dtype, tp=tp)
        )
        self.input_layernorm = GemmaRMSNorm(hidden, eps, dtype)
        self.post_attention_layernorm = GemmaRMSNorm(hidden, eps, dtype)
        self.pre_feedforward_layernorm = GemmaRMSNorm(hidden, eps, dtype)
        self.post_feedforward_layernorm = GemmaRMSNorm(hidden, eps, dtype)

    def forward(
        self,
        hidden_states: torch.Tensor,
        cos_sin: tuple[torch.Tensor, ...],
        kv_cache: torch.Tensor,
        attn_metadata: Any,
    ) -> torch.Tensor:
        attn = self.self_attn(self.input_layernorm(hidden_states), cos_sin, kv_cache, attn_metadata)
        hidden_states = hidden_states + self.post_attention_layernorm(attn)
        mlp = self.mlp(self.pre_feedforward_layernorm(hidden_states))
        result: torch.Tensor = hidden_states + self.post_feedforward_layernorm(mlp)
        return result


class GemmaModel(torch.nn.Module):
    def __init__(self, ctx: ModelContext, options: DecoderOptions, prefix: str = "model"):
        super().__init__()
        cfg, dtype = ctx.hf_config, ctx.dtype
        tp = current_tensor_parallel()
        vocab, hidden = int(cfg.vocab_size), int(cfg.hidden_size)
        self.embed_tokens = (
            VocabEmbedding(vocab, hidden, dtype)
            if tp is None
            else VocabParallelEmbedding(
                vocab, hidden, dtype, tp=tp, prefix=f"{prefix}.embed_tokens"
            )
        )
        self.embed_scale = float(hidden) ** 0.5
        self.layers = torch.nn.ModuleList(
            GemmaDecoderLayer(ctx, options, i, f"{prefix}.layers.{i}")
            for i in range(int(cfg.num_hidden_layers))
        )
        self.norm = GemmaRMSNorm(hidden, float(cfg.rms_norm_eps), dtype)
        head_dim = head_dim_of(cfg)
        layer_types = sorted({layer.layer_type for layer in self.layers})
        self.rotary = torch.nn.ModuleDict(
            {t: RotaryEmbedding(rope_for_layer_type(cfg, t, head_dim)) for t in layer_types}
        )

    def forward(
        self,
        input_ids: torch.Tensor,
        positions: torch.Tensor,
        kv_caches: list[torch.Tensor],
        attn_metadata: Any,
    ) -> torch.Tensor:
        hidden_states = self.embed_tokens(input_ids)
        # HF rounds the scale to the activation dtype first (sqrt(2304) in bf16 is 48.0).
        hidden_states = hidden_states * torch.tensor(self.embed_scale, dtype=hidden_states.dtype)
        cos_sin = {
            name: rotary.cos_sin(positions, hidden_states.dtype)
            for name, rotary in self.rotary.items()
        }
        for layer, kv_cache in zip(self.layers, kv_caches, strict=True):
            hidden_states = layer(hidden_states, cos_sin[layer.layer_type], kv_cache, attn_metadata)
        result: torch.Tensor = self.norm(hidden_states)
        return result


class _GemmaForCausalLM(DecoderForCausalLM):
    """Shared by Gemma 2 and 3; weight loading and q/k/v merging come from the decoder."""

    def __init__(self, ctx: ModelContext) -> None:
        ModelArchitecture.__init__(self, ctx)
        cfg = ctx.hf_config
        self.model = GemmaModel(ctx, self.options, "model")  # type: ignore[assignment]
        tp = current_tensor_parallel()
        vocab, hidden = int(cfg.vocab_size), int(cfg.hidden_size)
        self.lm_head = (
            LMHead(vocab, hidden, ctx.dtype)
            if tp is None
            else ParallelLMHead(vocab, hidden, ctx.dtype, tp=tp)
        )
        if getattr(cfg, "tie_word_embeddings", True):
            self.lm_head.tie(self.model.embed_tokens)
        cap = getattr(cfg, "final_logit_softcapping", None)
        self.final_logit_softcapping = float(cap) if cap else None

    def merge_projections(self) -> None:
        for layer in self.model.layers:
            assert isinstance(layer, GemmaDecoderLayer)
            layer.self_attn.merge_projections()
            if isinstance(layer.mlp, GatedMLP):
                layer.mlp.merge_projections()

    def compute_logits(self, hidden_states: torch.Tensor) -> torch.Tensor:
        logits: torch.Tensor = self.lm_head(hidden_states)
        cap = self.final_logit_softcapping
        if cap is not None:
            logits = torch.tanh(logits / cap) * cap
        return logits


class Gemma2ForCausalLM(_GemmaForCausalLM):
    options: ClassVar[DecoderOptions] = DecoderOptions(mlp_bias=False)


class Gemma3ForCausalLM(_GemmaForCausalLM):
    options: ClassVar[DecoderOptions] = DecoderOptions(qk_norm=True, mlp_bias=False)
