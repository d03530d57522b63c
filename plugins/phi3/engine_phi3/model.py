"""Phi3ForCausalLM: the generic decoder, loaded from fused ``qkv_proj`` / ``gate_up_proj``.

Phi-3 checkpoints store q, k and v as one ``self_attn.qkv_proj.weight`` and the MLP's gate
and up as one ``mlp.gate_up_proj.weight``; the loader splits them by rows into the
decoder's ``q_proj`` / ``k_proj`` / ``v_proj`` and ``gate_proj`` / ``up_proj`` (which the
merge after loading fuses again, and which tensor parallelism shards per projection)::

    qkv_proj   [ q: heads * d | k: kv_heads * d | v: kv_heads * d ]   x hidden
    gate_up    [ gate: intermediate | up: intermediate ]               x hidden

Rope is LongRoPE when ``rope_scaling.type`` is ``longrope`` (Phi-3-mini-128k, Phi-3.5,
Phi-4-mini) and partial when ``partial_rotary_factor`` < 1 (Phi-4-mini).
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import ClassVar

import torch
from engine_sdk.layers.decoder import DecoderForCausalLM, DecoderOptions, head_dim_of

_QKV = ".self_attn.qkv_proj."
_GATE_UP = ".mlp.gate_up_proj."


class Phi3ForCausalLM(DecoderForCausalLM):
    options: ClassVar[DecoderOptions] = DecoderOptions(attention_bias=False, mlp_bias=False)

    def _split_fused(
        self, weights: Iterable[tuple[str, torch.Tensor]]
    ) -> Iterator[tuple[str, torch.Tensor]]:
        cfg = self.ctx.hf_config
        head_dim = head_dim_of(cfg)
        num_heads = int(cfg.num_attention_heads)
        num_kv_heads = int(getattr(cfg, "num_key_value_heads", None) or num_heads)
        qkv_sizes = [num_heads * head_dim, num_kv_heads * head_dim, num_kv_heads * head_dim]
        intermediate = int(cfg.intermediate_size)
        for name, tensor in weights:
            if _QKV in name:
                self._check_rows(name, tensor, sum(qkv_sizes))
                base, _, leaf = name.partition(_QKV)
                parts = tensor.split(qkv_sizes, dim=0)
                for proj, part in zip(("q_proj", "k_proj", "v_proj"), parts, strict=True):
                    yield f"{base}.self_attn.{proj}.{leaf}", part
            elif _GATE_UP in name:
                self._check_rows(name, tensor, 2 * intermediate)
                base, _, leaf = name.partition(_GATE_UP)
                gate, up = tensor.split([intermediate, intermediate], dim=0)
                yield f"{base}.mlp.gate_proj.{leaf}", gate
                yield f"{base}.mlp.up_proj.{leaf}", up
            else:
                yield name, tensor

    @staticmethod
    def _check_rows(name: str, tensor: torch.Tensor, expected: int) -> None:
        if tensor.dim() == 0 or tensor.shape[0] != expected:
            raise ValueError(
                f"checkpoint tensor {name!r} has shape {tuple(tensor.shape)}; the config "
                f"(heads, kv heads, head_dim, intermediate_size) expects {expected} rows. "
                "Quantized fused Phi-3 checkpoints are not supported: use an unquantized one"
            )

    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> set[str]:
        return super().load_weights(self._split_fused(weights))
