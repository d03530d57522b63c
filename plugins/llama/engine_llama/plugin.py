"""Entry point of engine-llama: declares the architectures; imports no torch."""

from __future__ import annotations

from engine_sdk import ModelArchitectureSpec, hookimpl


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
