"""Qwen3MoeForCausalLM and MixtralForCausalLM: the generic decoder with sparse MoE blocks.

The attention is the generic decoder's (Qwen3-MoE with q/k norm, Mixtral as Mistral); the
feed-forward block of a sparse layer is a router (``gate``, replicated) and the SDK's
``FusedMoE`` (``experts``). Checkpoints store every expert separately::

    Qwen3-MoE  model.layers.N.mlp.experts.E.{gate_proj,up_proj,down_proj}.weight
    Mixtral    model.layers.N.block_sparse_moe.experts.E.{w1,w3,w2}.weight   (gate, up, down)

and ``load_weights`` copies each into the stacked expert tensors. Routing: softmax over the
experts, top ``num_experts_per_tok``, then renormalised over them (Mixtral always;
Qwen3-MoE when ``norm_topk_prob``). Qwen3-MoE layers in ``mlp_only_layers``, or off the
``decoder_sparse_step`` grid, keep a dense MLP.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Iterator
from typing import ClassVar

import torch
from engine_sdk.interfaces.model import ModelContext
from engine_sdk.layers.decoder import DecoderForCausalLM, DecoderLayer, DecoderOptions
from engine_sdk.layers.linear import Linear
from engine_sdk.layers.moe import FusedMoE
from engine_sdk.layers.parallel import current_tensor_parallel

__all__ = ["MixtralForCausalLM", "MoeBlock", "Qwen3MoeForCausalLM"]

_EXPERT = re.compile(r"^(?P<block>.+\.mlp)\.experts\.(?P<expert>\d+)\.(?P<proj>\w+)\.weight$")
_PROJ = {"gate_proj": "gate", "up_proj": "up", "down_proj": "down", "w1": "gate", "w3": "up"}
_PROJ["w2"] = "down"


class MoeBlock(torch.nn.Module):
    """``experts(x, gate(x))``: router logits in the activation dtype, as transformers."""

    def __init__(
        self,
        ctx: ModelContext,
        prefix: str,
        num_experts: int,
        top_k: int,
        intermediate_size: int,
        renormalize: bool,
    ) -> None:
        super().__init__()
        if ctx.quant_config is not None:
            raise ValueError(
                f"{prefix}: quantized mixture-of-experts checkpoints are not supported yet; "
                "use the unquantized (bf16) checkpoint"
            )
        hidden = int(ctx.hf_config.hidden_size)
        self.gate = Linear(hidden, num_experts, False, None, f"{prefix}.gate", ctx.dtype)
        self.experts = FusedMoE(
            num_experts,
            top_k,
            hidden,
            intermediate_size,
            renormalize,
            ctx.dtype,
            f"{prefix}.experts",
            tp=current_tensor_parallel(),
        )

    def forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
        out: torch.Tensor = self.experts(hidden_states, self.gate(hidden_states))
        return out


class Qwen3MoeDecoderLayer(DecoderLayer):
    def make_mlp(
        self, ctx: ModelContext, options: DecoderOptions, layer_idx: int, prefix: str
    ) -> torch.nn.Module:
        cfg = ctx.hf_config
        step = int(getattr(cfg, "decoder_sparse_step", 1) or 1)
        dense = layer_idx in (getattr(cfg, "mlp_only_layers", None) or []) or (
            int(cfg.num_experts) == 0 or (layer_idx + 1) % step != 0
        )
        if dense:
            return super().make_mlp(ctx, options, layer_idx, prefix)
        return MoeBlock(
            ctx,
            prefix,
            int(cfg.num_experts),
            int(cfg.num_experts_per_tok),
            int(cfg.moe_intermediate_size),
            bool(getattr(cfg, "norm_topk_prob", False)),
        )


class MixtralDecoderLayer(DecoderLayer):
    def make_mlp(
        self, ctx: ModelContext, options: DecoderOptions, layer_idx: int, prefix: str
    ) -> torch.nn.Module:
        cfg = ctx.hf_config
        return MoeBlock(
            ctx,
            prefix,
            int(cfg.num_local_experts),
            int(cfg.num_experts_per_tok),
            int(cfg.intermediate_size),
            renormalize=True,
        )


class _MoeForCausalLM(DecoderForCausalLM):
    """Per-expert checkpoint tensors go to their ``FusedMoE``; the rest load by name."""

    # Checkpoint module name of the feed-forward block -> this model's (``mlp``).
    block_renames: ClassVar[tuple[tuple[str, str], ...]] = ()

    def _rename(self, name: str) -> str:
        for old, new in self.block_renames:
            name = name.replace(old, new)
        return name

    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> set[str]:
        expert_params: set[str] = set()

        def dense(items: Iterable[tuple[str, torch.Tensor]]) -> Iterator[tuple[str, torch.Tensor]]:
            for raw_name, tensor in items:
                name = self._rename(raw_name)
                match = _EXPERT.match(name)
                if match is None:
                    yield name, tensor
                    continue
                proj = _PROJ.get(match["proj"])
                experts = self._experts_at(f"{match['block']}.experts", raw_name)
                if proj is None:
                    raise ValueError(
                        f"checkpoint tensor {raw_name!r}: unknown expert projection "
                        f"{match['proj']!r}; expected one of {', '.join(_PROJ)}"
                    )
                experts.load_expert(int(match["expert"]), proj, tensor)
                param = "w2" if proj == "down" else "w13"
                expert_params.add(f"{match['block']}.experts.{param}")

        loaded = super().load_weights(dense(weights))
        return loaded | expert_params

    def _experts_at(self, path: str, raw_name: str) -> FusedMoE:
        try:
            module = self.get_submodule(path)
        except AttributeError:
            module = None
        if not isinstance(module, FusedMoE):
            raise ValueError(
                f"checkpoint tensor {raw_name!r} is an expert weight, but "
                f"{type(self).__name__} has no experts at {path!r}; do the config's "
                "num_experts / mlp_only_layers match the checkpoint?"
            )
        return module


class Qwen3MoeForCausalLM(_MoeForCausalLM):
    options: ClassVar[DecoderOptions] = DecoderOptions(qk_norm=True)
    layer_cls: ClassVar[type[DecoderLayer]] = Qwen3MoeDecoderLayer


class MixtralForCausalLM(_MoeForCausalLM):
    options: ClassVar[DecoderOptions] = DecoderOptions(attention_bias=False, mlp_bias=False)
    layer_cls: ClassVar[type[DecoderLayer]] = MixtralDecoderLayer
    block_renames: ClassVar[tuple[tuple[str, str], ...]] = ((".block_sparse_moe.", ".mlp."),)
