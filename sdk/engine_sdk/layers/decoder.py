"""A generic Llama-style decoder-only model, configured from an HF config.

Llama, Mistral and Qwen3 share one block; options cover their differences (Qwen3's
per-head q/k RMSNorm, attention and MLP biases). Module names match the HF checkpoints
(``model.layers.N.self_attn.q_proj``, ``model.norm``, ``lm_head``), so the weight loader
copies tensors by name. A model plugin subclasses :class:`DecoderForCausalLM` and sets
``architectures`` and ``options``::

    embed -> [ norm -> attention(rope) -> +residual -> norm -> gated MLP -> +residual ] x N
          -> norm -> (selected rows) lm_head
"""

from __future__ import annotations

import functools
import os
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any, ClassVar

import torch

from engine_sdk.interfaces.model import ModelArchitecture, ModelContext
from engine_sdk.layers import fused_ops, gemv
from engine_sdk.layers.activation import GatedMLP
from engine_sdk.layers.attention import KV_SCALE_SUFFIXES, Attention, load_kv_scale
from engine_sdk.layers.embedding import LMHead, VocabEmbedding
from engine_sdk.layers.linear import Linear, is_method_only, merge_linears
from engine_sdk.layers.lora import expand_in_act
from engine_sdk.layers.norm import RMSNorm
from engine_sdk.layers.parallel import (
    ColumnParallelLinear,
    ParallelGatedMLP,
    ParallelLMHead,
    RowParallelLinear,
    VocabParallelEmbedding,
    current_tensor_parallel,
    shard_attention_heads,
)
from engine_sdk.layers.rotary import RotaryEmbedding, apply_rotary, rope_parameters_from_config

__all__ = ["DecoderAttention", "DecoderForCausalLM", "DecoderOptions", "head_dim_of"]

# Checkpoint tensors that are not parameters (recomputed buffers in old exports).
_IGNORED_SUFFIXES = ("rotary_emb.inv_freq", "rotary_emb.cos_cached", "rotary_emb.sin_cached")


@dataclass(frozen=True)
class DecoderOptions:
    """Differences between Llama-family models. ``None`` reads the HF config's flag."""

    qk_norm: bool = False  # Qwen3: RMSNorm over head_dim on q and k before rope
    attention_bias: bool | None = None  # config.attention_bias (default False)
    mlp_bias: bool | None = None  # config.mlp_bias (default False)
    # Qwen2: bias on q/k/v only. None: o_proj follows the attention bias.
    o_proj_bias: bool | None = None


def head_dim_of(hf_config: Any) -> int:
    head_dim = getattr(hf_config, "head_dim", None)
    return int(head_dim or hf_config.hidden_size // hf_config.num_attention_heads)


def _sliding_window(hf_config: Any, layer_idx: int) -> int | None:
    window = getattr(hf_config, "sliding_window", None)
    if not window:
        return None
    layer_types = getattr(hf_config, "layer_types", None)
    if layer_types is not None:
        return int(window) if layer_types[layer_idx] == "sliding_attention" else None
    return int(window)


def _flag(option: bool | None, hf_config: Any, name: str) -> bool:
    return bool(getattr(hf_config, name, False)) if option is None else option


class DecoderAttention(torch.nn.Module):
    def __init__(self, ctx: ModelContext, options: DecoderOptions, layer_idx: int, prefix: str):
        super().__init__()
        cfg, dtype, quant = ctx.hf_config, ctx.dtype, ctx.quant_config
        self.num_heads = int(cfg.num_attention_heads)
        self.num_kv_heads = int(getattr(cfg, "num_key_value_heads", None) or self.num_heads)
        self.head_dim = head_dim_of(cfg)
        bias = _flag(options.attention_bias, cfg, "attention_bias")
        o_bias = bias if options.o_proj_bias is None else options.o_proj_bias
        hidden, q_size = int(cfg.hidden_size), self.num_heads * self.head_dim
        kv_size = self.num_kv_heads * self.head_dim
        tp = current_tensor_parallel()
        if tp is None:
            self.q_proj = Linear(hidden, q_size, bias, quant, f"{prefix}.q_proj", dtype)
            self.k_proj = Linear(hidden, kv_size, bias, quant, f"{prefix}.k_proj", dtype)
            self.v_proj = Linear(hidden, kv_size, bias, quant, f"{prefix}.v_proj", dtype)
            self.o_proj = Linear(q_size, hidden, o_bias, quant, f"{prefix}.o_proj", dtype)
        else:  # this rank's heads: q/k/v column-parallel, o_proj row-parallel
            shards = shard_attention_heads(self.num_heads, self.num_kv_heads, tp)
            self.num_heads, self.num_kv_heads = shards.num_heads, shards.num_kv_heads
            kv_shard = {"shard_index": shards.kv_shard_index, "num_shards": shards.num_kv_shards}
            self.q_proj = ColumnParallelLinear(
                hidden, q_size, bias, quant, f"{prefix}.q_proj", dtype, tp=tp
            )
            self.k_proj = ColumnParallelLinear(
                hidden, kv_size, bias, quant, f"{prefix}.k_proj", dtype, tp=tp, **kv_shard
            )
            self.v_proj = ColumnParallelLinear(
                hidden, kv_size, bias, quant, f"{prefix}.v_proj", dtype, tp=tp, **kv_shard
            )
            self.o_proj = RowParallelLinear(
                q_size, hidden, o_bias, quant, f"{prefix}.o_proj", dtype, tp=tp
            )
        self.q_norm: RMSNorm | None = None
        self.k_norm: RMSNorm | None = None
        if options.qk_norm:
            self.q_norm = self.make_norm(self.head_dim, cfg.rms_norm_eps, dtype)
            self.k_norm = self.make_norm(self.head_dim, cfg.rms_norm_eps, dtype)
        self.attn = self.make_attention(ctx, layer_idx, f"{prefix}.attn")
        self.qkv_proj: Linear | None = None  # set by merge_projections()

    def make_norm(self, size: int, eps: float, dtype: torch.dtype) -> RMSNorm:
        """The q/k norm; a subclass returns its own RMSNorm variant (Gemma's ``1 + w``)."""
        return RMSNorm(size, eps, dtype)

    def make_attention(self, ctx: ModelContext, layer_idx: int, prefix: str) -> Attention:
        """This layer's attention (this rank's heads); a subclass sets its own scale, soft
        cap or window (Gemma's ``query_pre_attn_scalar``)."""
        return Attention(
            ctx,
            self.num_heads,
            self.num_kv_heads,
            self.head_dim,
            sliding_window=_sliding_window(ctx.hf_config, layer_idx),
            prefix=prefix,
        )

    def _fuse_qkv_epilogue(self, hidden_states: torch.Tensor, cos: torch.Tensor) -> bool:
        """The q/k norm, rope and split as one kernel: CUDA (fused ops on), rope over the
        whole head (a power-of-two head size), and plain RMSNorms on both q and k or on
        neither (a subclass such as Gemma's (1 + w) norm computes something else)."""
        return (
            fused_ops.enabled(hidden_states)
            and cos.shape[-1] == self.head_dim
            and self.head_dim & (self.head_dim - 1) == 0
            and all(n is None or type(n) is RMSNorm for n in (self.q_norm, self.k_norm))
            and (self.q_norm is None) == (self.k_norm is None)
        )

    def merge_projections(self) -> None:
        """After loading: q, k and v as one GEMM (when their quantization method can merge)."""
        self.qkv_proj = merge_linears([self.q_proj, self.k_proj, self.v_proj])

    def forward(
        self,
        hidden_states: torch.Tensor,
        cos_sin: tuple[torch.Tensor, ...],
        kv_cache: torch.Tensor,
        attn_metadata: Any,
    ) -> torch.Tensor:
        if self.qkv_proj is not None:
            return self.forward_qkv(self.qkv_proj(hidden_states), cos_sin, kv_cache, attn_metadata)
        num_tokens = hidden_states.shape[0]
        q2 = self.q_proj(hidden_states)
        k2, v2 = self.k_proj(hidden_states), self.v_proj(hidden_states)
        return self._attend(q2, k2, v2, num_tokens, cos_sin, kv_cache, attn_metadata)

    def forward_qkv(
        self,
        qkv: torch.Tensor,
        cos_sin: tuple[torch.Tensor, ...],
        kv_cache: torch.Tensor,
        attn_metadata: Any,
    ) -> torch.Tensor:
        """The rest of ``forward`` from the merged q/k/v output (a caller that computed it
        with a fused kernel continues here)."""
        num_tokens = qkv.shape[0]
        q_size, kv_size = self.num_heads * self.head_dim, self.num_kv_heads * self.head_dim
        cos, sin = cos_sin
        if self._fuse_qkv_epilogue(qkv, cos):
            # K/V straight into the cache when the backend allows it (no store launch)
            target = self.attn.kv_store_target(kv_cache, attn_metadata)
            q, k, v = fused_ops.qkv_norm_rope(
                qkv,
                self.num_heads,
                self.num_kv_heads,
                None if self.q_norm is None else self.q_norm.weight,
                None if self.k_norm is None else self.k_norm.weight,
                self.q_norm.eps if self.q_norm is not None else 0.0,
                cos,
                sin,
                kv_store=target,
            )
            if k is None or v is None:
                out = self.attn.forward_stored(q, kv_cache, attn_metadata)
            else:
                out = self.attn(q, k, v, kv_cache, attn_metadata)
            fused: torch.Tensor = self.o_proj(out)
            return fused
        q2, k2 = qkv[..., :q_size], qkv[..., q_size : q_size + kv_size]
        v2 = qkv[..., q_size + kv_size :]
        return self._attend(q2, k2, v2, num_tokens, cos_sin, kv_cache, attn_metadata)

    def _attend(
        self,
        q2: torch.Tensor,
        k2: torch.Tensor,
        v2: torch.Tensor,
        num_tokens: int,
        cos_sin: tuple[torch.Tensor, ...],
        kv_cache: torch.Tensor,
        attn_metadata: Any,
    ) -> torch.Tensor:
        cos, sin = cos_sin
        q = q2.view(num_tokens, self.num_heads, self.head_dim)
        k = k2.view(num_tokens, self.num_kv_heads, self.head_dim)
        v = v2.view(num_tokens, self.num_kv_heads, self.head_dim)
        if self.q_norm is not None and self.k_norm is not None:
            q, k = self.q_norm(q), self.k_norm(k)
        q, k = apply_rotary(q, cos, sin), apply_rotary(k, cos, sin)
        out = self.attn(q.contiguous(), k.contiguous(), v.contiguous(), kv_cache, attn_metadata)
        result: torch.Tensor = self.o_proj(out)
        return result


class DecoderLayer(torch.nn.Module):
    def __init__(self, ctx: ModelContext, options: DecoderOptions, layer_idx: int, prefix: str):
        super().__init__()
        cfg, dtype = ctx.hf_config, ctx.dtype
        self.self_attn = DecoderAttention(ctx, options, layer_idx, f"{prefix}.self_attn")
        self.mlp: torch.nn.Module = self.make_mlp(ctx, options, layer_idx, f"{prefix}.mlp")
        self.input_layernorm = RMSNorm(int(cfg.hidden_size), cfg.rms_norm_eps, dtype)
        self.post_attention_layernorm = RMSNorm(int(cfg.hidden_size), cfg.rms_norm_eps, dtype)

    def make_mlp(
        self, ctx: ModelContext, options: DecoderOptions, layer_idx: int, prefix: str
    ) -> torch.nn.Module:
        """The feed-forward block ``x -> x``; a subclass returns a mixture of experts."""
        cfg = ctx.hf_config
        mlp_args = (
            int(cfg.hidden_size),
            int(cfg.intermediate_size),
            getattr(cfg, "hidden_act", "silu"),
            _flag(options.mlp_bias, cfg, "mlp_bias"),
            ctx.quant_config,
            prefix,
            ctx.dtype,
        )
        tp = current_tensor_parallel()
        return GatedMLP(*mlp_args) if tp is None else ParallelGatedMLP(*mlp_args, tp=tp)

    def forward(
        self,
        hidden_states: torch.Tensor,
        residual: torch.Tensor | None,
        cos_sin: tuple[torch.Tensor, ...],
        kv_cache: torch.Tensor,
        attn_metadata: Any,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """``(block output, residual stream)``: the residual add is left to the next norm
        (``add_forward``), which fuses it; the first layer gets ``residual=None``. At decode
        the add and the norm run inside the next projection's GEMV where they can
        (``_norm_then_gemv``)."""
        attn, mlp = self.self_attn, self.mlp
        if residual is None:
            residual = hidden_states
            hidden_states = attn(
                self.input_layernorm(hidden_states), cos_sin, kv_cache, attn_metadata
            )
        else:
            pair = None
            if type(attn).forward is DecoderAttention.forward:
                pair = _norm_then_gemv(self.input_layernorm, attn.qkv_proj, hidden_states, residual)
            if pair is not None:
                qkv, residual = pair
                hidden_states = attn.forward_qkv(qkv, cos_sin, kv_cache, attn_metadata)
            else:
                hidden_states, residual = self.input_layernorm.add_forward(hidden_states, residual)
                hidden_states = attn(hidden_states, cos_sin, kv_cache, attn_metadata)
        if isinstance(mlp, GatedMLP) and type(mlp).forward is GatedMLP.forward:
            pair = _norm_gate_up_silu(self.post_attention_layernorm, mlp, hidden_states, residual)
            if pair is not None:
                hidden, residual = pair
                return mlp.down_proj(hidden), residual
            deferred = _norm_gate_up_deferred(
                self.post_attention_layernorm, mlp, hidden_states, residual
            )
            if deferred is not None:
                gate_up, residual, pending = deferred
                return mlp.forward_gate_up(gate_up, pending), residual
            pair = _norm_then_gemv(
                self.post_attention_layernorm, mlp.gate_up_proj, hidden_states, residual
            )
            if pair is not None:
                gate_up, residual = pair
                return mlp.forward_gate_up(gate_up), residual
        hidden_states, residual = self.post_attention_layernorm.add_forward(hidden_states, residual)
        return mlp(hidden_states), residual


@functools.lru_cache(maxsize=1)
def _fused_norm_enabled() -> bool:
    """``ENGINE_FUSED_NORM`` is not ``0`` (read once; ``cache_clear`` for tests)."""
    return os.environ.get("ENGINE_FUSED_NORM", "1") != "0"


def _norm_then_gemv(
    norm: torch.nn.Module, proj: Linear | None, x: torch.Tensor, residual: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor] | None:
    """``(proj(norm(x + residual)), x + residual)`` as one kernel, the projection's
    quantization method's ``apply_add_rms_norm`` (the unquantized one:
    ``gemv.gemv_add_rms_norm``), for a plain RMSNorm before a projection that runs only its
    method in this step (with adapters in the step: ``Linear.lora_add_rms_norm``); None
    where the method does not fuse the call, or with ``ENGINE_FUSED_NORM=0`` (the separate
    add+RMSNorm kernel: for timing the fusion)."""
    if not _fused_norm_enabled():
        return None
    if type(norm) is not RMSNorm or not isinstance(proj, Linear):
        return None
    assert isinstance(norm, RMSNorm)
    if not is_method_only(proj):  # adapters in this step: the GEMV with the LoRA epilogue
        return proj.lora_add_rms_norm(x, residual, norm.weight, norm.eps)
    return proj.quant_method.apply_add_rms_norm(proj, x, residual, norm.weight, norm.eps, proj.bias)


def _norm_gate_up_deferred(
    norm: torch.nn.Module, mlp: GatedMLP, x: torch.Tensor, residual: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor, gemv.LoRAEpilogue] | None:
    """With adapters in a decode step and ``ENGINE_LORA_EXPAND_IN_ACT=1``: the merged
    gate/up through the fused add+RMSNorm GEMV that writes its adapter's shrink from its
    own first programs, the expand left to the SiLU-and-mul kernel (``(gate_up without
    the expand, x + residual, the expand)``); None elsewhere."""
    proj = mlp.gate_up_proj
    if not (_fused_norm_enabled() and expand_in_act()) or mlp.hidden_act != "silu":
        return None
    if type(norm) is not RMSNorm or not isinstance(proj, Linear) or is_method_only(proj):
        return None
    assert isinstance(norm, RMSNorm)
    return proj.lora_add_rms_norm_deferred(x, residual, norm.weight, norm.eps)


@functools.lru_cache(maxsize=1)
def _fused_silu_enabled() -> bool:
    """``ENGINE_FUSED_SILU`` is not ``0`` (read once; ``cache_clear`` for tests)."""
    return os.environ.get("ENGINE_FUSED_SILU", "1") != "0"


def _norm_gate_up_silu(
    norm: torch.nn.Module, mlp: GatedMLP, x: torch.Tensor, residual: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor] | None:
    """``(silu(gate) * up of norm(x + residual), x + residual)`` as one kernel, the merged
    gate/up projection's ``QuantizationMethod.apply_add_rms_norm_silu`` (the unquantized
    and FP8 methods: the gated ``gemv.gemv_add_rms_norm``), for a plain RMSNorm before a
    SiLU MLP whose gate/up runs only its method in the step (no adapter); None where the
    method does not fuse the call (it runs at decode, at one row), or with
    ``ENGINE_FUSED_SILU=0`` or ``ENGINE_FUSED_NORM=0``."""
    proj = mlp.gate_up_proj
    if not (_fused_norm_enabled() and _fused_silu_enabled()):
        return None
    if type(norm) is not RMSNorm or mlp.hidden_act != "silu" or not is_method_only(proj):
        return None
    assert isinstance(proj, Linear) and isinstance(norm, RMSNorm)
    return proj.quant_method.apply_add_rms_norm_silu(
        proj, x, residual, norm.weight, norm.eps, proj.bias
    )


class DecoderModel(torch.nn.Module):
    def __init__(
        self,
        ctx: ModelContext,
        options: DecoderOptions,
        prefix: str = "model",
        layer_cls: type[DecoderLayer] = DecoderLayer,
    ):
        super().__init__()
        cfg, dtype = ctx.hf_config, ctx.dtype
        self.dtype = dtype
        tp = current_tensor_parallel()
        vocab, hidden = int(cfg.vocab_size), int(cfg.hidden_size)
        self.embed_tokens = (
            VocabEmbedding(vocab, hidden, dtype)
            if tp is None
            else VocabParallelEmbedding(
                vocab, hidden, dtype, tp=tp, prefix=f"{prefix}.embed_tokens"
            )
        )
        self.layers = torch.nn.ModuleList(
            layer_cls(ctx, options, i, f"{prefix}.layers.{i}")
            for i in range(int(cfg.num_hidden_layers))
        )
        self.norm = RMSNorm(int(cfg.hidden_size), cfg.rms_norm_eps, dtype)
        self.rotary_emb = RotaryEmbedding(rope_parameters_from_config(cfg, head_dim_of(cfg)))

    def forward(
        self,
        input_ids: torch.Tensor,
        positions: torch.Tensor,
        kv_caches: list[torch.Tensor],
        attn_metadata: Any,
    ) -> torch.Tensor:
        hidden_states = self.embed_tokens(input_ids)
        cos_sin = self.rotary_emb.cos_sin(positions, hidden_states.dtype)
        residual: torch.Tensor | None = None
        for layer, kv_cache in zip(self.layers, kv_caches, strict=True):
            hidden_states, residual = layer(
                hidden_states, residual, cos_sin, kv_cache, attn_metadata
            )
        if residual is None:  # no layers
            result: torch.Tensor = self.norm(hidden_states)
            return result
        result, _ = self.norm.add_forward(hidden_states, residual)
        return result


class DecoderForCausalLM(ModelArchitecture):
    """A Llama-style causal LM; subclasses set ``architectures`` and ``options``."""

    options: ClassVar[DecoderOptions] = DecoderOptions()
    # The block; a subclass overriding ``DecoderLayer.make_mlp`` (MoE models) sets its own.
    layer_cls: ClassVar[type[DecoderLayer]] = DecoderLayer
    # Builds per-rank shards inside ``engine_sdk.layers.parallel.tensor_parallel``.
    supports_tensor_parallel: ClassVar[bool] = True

    def __init__(self, ctx: ModelContext) -> None:
        super().__init__(ctx)
        cfg = ctx.hf_config
        self.model = DecoderModel(ctx, self.options, "model", self.layer_cls)
        tp = current_tensor_parallel()
        vocab, hidden = int(cfg.vocab_size), int(cfg.hidden_size)
        self.lm_head = (
            LMHead(vocab, hidden, ctx.dtype)
            if tp is None
            else ParallelLMHead(vocab, hidden, ctx.dtype, tp=tp)
        )
        if getattr(cfg, "tie_word_embeddings", False):
            self.lm_head.tie(self.model.embed_tokens)

    def forward(
        self,
        input_ids: torch.Tensor,
        positions: torch.Tensor,
        kv_caches: list[torch.Tensor],
        attn_metadata: Any,
    ) -> torch.Tensor:
        hidden: torch.Tensor = self.model(input_ids, positions, kv_caches, attn_metadata)
        return hidden

    def merge_projections(self) -> None:
        """Called by the loader once weights are final (after quantization processing):
        q/k/v and gate/up run as one GEMM each where their methods can merge."""
        for layer in self.model.layers:
            assert isinstance(layer, DecoderLayer)
            layer.self_attn.merge_projections()
            if isinstance(layer.mlp, GatedMLP):
                layer.mlp.merge_projections()

    def compute_logits(self, hidden_states: torch.Tensor) -> torch.Tensor:
        logits: torch.Tensor = self.lm_head(hidden_states)
        return logits

    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> set[str]:
        """Copy checkpoint tensors into the parameters of the same name.

        A parameter with a ``weight_loader(param, tensor)`` attribute (set by a
        quantization method) loads itself. fp8 KV cache scales (``*.k_scale``, ``*.v_scale``,
        ``*.kv_scale``) go to their attention layer's backend. A tied ``lm_head.weight`` is
        skipped; an unknown name or a shape mismatch raises ``ValueError`` naming the tensor.
        """
        tied = self.lm_head.tied
        return load_named_weights(
            self, ((n, t) for n, t in weights if not (tied and n == "lm_head.weight"))
        )


def load_named_weights(
    model: torch.nn.Module, weights: Iterable[tuple[str, torch.Tensor]]
) -> set[str]:
    """Copy (name, tensor) pairs into ``model``'s parameters of the same name; see
    ``DecoderForCausalLM.load_weights`` (quantized loaders, KV scales, errors)."""
    params = dict(model.named_parameters())
    loaded: set[str] = set()
    for name, tensor in weights:
        if name.endswith(_IGNORED_SUFFIXES):
            continue
        param = params.get(name)
        if param is None and name.endswith(KV_SCALE_SUFFIXES):
            load_kv_scale(model, name, tensor)  # fp8 KV cache scales: not parameters
            continue
        if param is None:
            raise ValueError(
                f"checkpoint tensor {name!r} has no parameter in {type(model).__name__}; "
                "is the checkpoint for a different architecture or quantization?"
            )
        weight_loader = getattr(param, "weight_loader", None)
        if weight_loader is not None:
            weight_loader(param, tensor)
        else:
            if tuple(param.shape) != tuple(tensor.shape):
                raise ValueError(
                    f"checkpoint tensor {name!r} has shape {tuple(tensor.shape)}, "
                    f"the model expects {tuple(param.shape)}"
                )
            param.data.copy_(tensor)
        loaded.add(name)
    return loaded
