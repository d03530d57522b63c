"""Entry point of engine-qwen3: declares the architecture; imports no torch."""

from __future__ import annotations

from engine_sdk import ModelArchitectureSpec, hookimpl


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
