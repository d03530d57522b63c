"""Entry point of engine-qwen3: declares the architecture; imports no torch."""

from __future__ import annotations

from engine_sdk import ModelArchitectureSpec, PoolingModelSpec, hookimpl


@hookimpl
def register_model_architectures() -> list[ModelArchitectureSpec]:
    return [
        ModelArchitectureSpec(
            name="qwen3",
            target="engine_qwen3.model:Qwen3ForCausalLM",
            description="Qwen3 dense decoder (q/k RMSNorm, GQA, rope)",
            architectures=("Qwen3ForCausalLM",),
        )
    ]


@hookimpl
def register_pooling_models() -> list[PoolingModelSpec]:
    return [
        PoolingModelSpec(
            name="qwen3-embed",
            target="engine_qwen3.embedding:Qwen3EmbeddingModel",
            description="Qwen3 body as an embedder (last-token pooling: Qwen3-Embedding)",
            architectures=("Qwen3ForCausalLM", "Qwen3Model"),
            pooling="last",
        )
    ]
