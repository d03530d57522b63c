"""Entry point of engine-moe: declares the architectures; imports no torch."""

from __future__ import annotations

from engine_sdk import ModelArchitectureSpec, hookimpl


@hookimpl
def register_model_architectures() -> list[ModelArchitectureSpec]:
    return [
        ModelArchitectureSpec(
            name="qwen3_moe",
            target="engine_moe.model:Qwen3MoeForCausalLM",
            description="Qwen3 mixture of experts (top-k routing, q/k norm)",
            architectures=("Qwen3MoeForCausalLM",),
        ),
        ModelArchitectureSpec(
            name="mixtral",
            target="engine_moe.model:MixtralForCausalLM",
            description="Mixtral mixture of experts (top-2 of 8, renormalised)",
            architectures=("MixtralForCausalLM",),
        ),
    ]
