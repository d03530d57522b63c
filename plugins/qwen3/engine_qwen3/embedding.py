"""Qwen3 body as an embedder (Qwen3-Embedding: last-token pooling, normalized)."""

from __future__ import annotations

from typing import ClassVar

from engine_sdk.layers.decoder import DecoderOptions
from engine_sdk.layers.decoder_embedding import DecoderEmbeddingModel


class Qwen3EmbeddingModel(DecoderEmbeddingModel):
    architectures: ClassVar[tuple[str, ...]] = ("Qwen3ForCausalLM", "Qwen3Model")
    options: ClassVar[DecoderOptions] = DecoderOptions(qk_norm=True)
