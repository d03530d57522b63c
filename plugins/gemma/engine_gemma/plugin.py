"""Entry point of engine-gemma: declares the architectures; imports no torch."""

from __future__ import annotations

from engine_sdk import ModelArchitectureSpec, hookimpl


@hookimpl
def register_model_architectures() -> list[ModelArchitectureSpec]:
    return [
        ModelArchitectureSpec(
            name="gemma2",
            target="engine_gemma.model:Gemma2ForCausalLM",
            description="Gemma 2 decoder (local/global layers, logit soft-capping)",
            architectures=("Gemma2ForCausalLM",),
        ),
        ModelArchitectureSpec(
            name="gemma3",
            target="engine_gemma.model:Gemma3ForCausalLM",
            description="Gemma 3 text decoder (local/global rope, q/k norm)",
            architectures=("Gemma3ForCausalLM",),
        ),
    ]
