"""Entry point: declares the Triton attention backend (no torch or triton import here)."""

from __future__ import annotations

from engine_sdk import AttentionBackendSpec, hookimpl


@hookimpl
def register_attention_backends() -> list[AttentionBackendSpec]:
    return [
        AttentionBackendSpec(
            name="triton",
            target="engine_triton.backend:TritonAttentionBackend",
            description="Triton paged attention (prefill with cached prefix, GQA decode)",
            devices=("cuda",),
            dtypes=("float16", "bfloat16", "float32"),
            block_sizes=(16, 32, 64),
            kv_cache_dtypes=("auto", "fp8", "fp8_e4m3"),
            supports_logits_soft_cap=True,
            priority=10,
        )
    ]
