"""Llama body as an embedder (mean pooling by default, e.g. for LlamaModel checkpoints)."""

from __future__ import annotations

from typing import ClassVar

from engine_sdk.layers.decoder import DecoderOptions
from engine_sdk.layers.decoder_embedding import DecoderEmbeddingModel


class LlamaEmbeddingModel(DecoderEmbeddingModel):
    architectures: ClassVar[tuple[str, ...]] = ("LlamaForCausalLM", "LlamaModel")
    options: ClassVar[DecoderOptions] = DecoderOptions()
