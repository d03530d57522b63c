"""Entry point of engine-llama: declares the architectures; imports no torch."""

from __future__ import annotations

from engine_sdk import ModelArchitectureSpec, PoolingModelSpec, hookimpl


@hookimpl
def register_model_architectures() -> list[ModelArchitectureSpec]:
    return [
        ModelArchitectureSpec(
            name="llama",
            target="engine_llama.model:LlamaForCausalLM",
            description="Llama 2/3 decoder (GQA, rope scaling incl. llama3)",
            architectures=("LlamaForCausalLM",),
        ),
        ModelArchitectureSpec(
            name="mistral",
            target="engine_llama.model:MistralForCausalLM",
            description="Mistral decoder (Llama math, optional sliding window)",
            architectures=("MistralForCausalLM",),
        ),
    ]


@hookimpl
def register_pooling_models() -> list[PoolingModelSpec]:
    return [
        PoolingModelSpec(
            name="llama-embed",
            target="engine_llama.embedding:LlamaEmbeddingModel",
            description="Llama body as an embedder (mean pooling by default)",
            architectures=("LlamaForCausalLM", "LlamaModel"),
            pooling="mean",
        )
    ]
