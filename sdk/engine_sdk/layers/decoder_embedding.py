"""A Llama-style decoder body as an embedder: ``DecoderModel`` without the LM head.

Checkpoints name the body's tensors ``model.layers.0...`` (a ``*ForCausalLM`` saved whole)
or ``layers.0...`` (a bare ``*Model`` such as Qwen3-Embedding's); both load. The LM head
of a causal-LM checkpoint is skipped: an embedder pools hidden states, it never samples.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import Any, ClassVar

import torch

from engine_sdk.interfaces.model import ModelContext
from engine_sdk.interfaces.pooling import PoolingModel
from engine_sdk.layers.activation import GatedMLP
from engine_sdk.layers.decoder import DecoderLayer, DecoderModel, DecoderOptions, load_named_weights

__all__ = ["DecoderEmbeddingModel"]


class DecoderEmbeddingModel(PoolingModel):
    """Subclasses set ``architectures`` and ``options`` (as for ``DecoderForCausalLM``)."""

    options: ClassVar[DecoderOptions] = DecoderOptions()

    def __init__(self, ctx: ModelContext) -> None:
        super().__init__(ctx)
        self.model = DecoderModel(ctx, self.options, "model")

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
        """q/k/v and gate/up as one GEMM each, as the causal LM does."""
        for layer in self.model.layers:
            assert isinstance(layer, DecoderLayer)
            layer.self_attn.merge_projections()
            if isinstance(layer.mlp, GatedMLP):
                layer.mlp.merge_projections()

    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> set[str]:
        return load_named_weights(self, _body_names(weights))


def _body_names(weights: Iterable[tuple[str, torch.Tensor]]) -> Iterator[tuple[str, torch.Tensor]]:
    for name, tensor in weights:
        if name.startswith("lm_head."):
            continue
        yield (name if name.startswith("model.") else f"model.{name}"), tensor
