"""Entry point of engine-qwen2: declares the architecture; imports no torch."""

from __future__ import annotations

from engine_sdk import ModelArchitectureSpec, hookimpl


@hookimpl
def register_model_architectures() -> list[ModelArchitectureSpec]:
    return [
        ModelArchitectureSpec(
            name="qwen2",
            target="engine_qwen2.model:Qwen2ForCausalLM",
            description="Qwen2 / Qwen2.5 decoder (q/k/v bias, GQA, rope)",
            architectures=("Qwen2ForCausalLM",),
        )
    ]
