"""Entry point of engine-phi3: declares the architecture; imports no torch."""

from __future__ import annotations

from engine_sdk import ModelArchitectureSpec, hookimpl


@hookimpl
def register_model_architectures() -> list[ModelArchitectureSpec]:
    return [
        ModelArchitectureSpec(
            name="phi3",
            target="engine_phi3.model:Phi3ForCausalLM",
            description="Phi-3 / Phi-4 decoder (fused qkv and gate_up, LongRoPE)",
            architectures=("Phi3ForCausalLM",),
        )
    ]
