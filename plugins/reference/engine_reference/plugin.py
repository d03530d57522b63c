"""Entry point of engine-reference: declares the backend; imports no torch."""

from __future__ import annotations

from engine_sdk import AttentionBackendSpec, hookimpl


@hookimpl
def register_attention_backends() -> list[AttentionBackendSpec]:
    return [
        AttentionBackendSpec(
            name="reference",
            target="engine_reference.backend:ReferenceAttentionBackend",
            description="torch SDPA per sequence over the paged cache (CPU and GPU)",
            devices=("cpu", "cuda"),
            dtypes=("float32", "float16", "bfloat16"),
            block_sizes=(1, 2, 4, 8, 16, 32, 64, 128, 256),
            kv_cache_dtypes=("auto", "fp8", "fp8_e4m3", "fp8_e5m2"),
            supports_logits_soft_cap=True,
            priority=0,
        )
    ]
