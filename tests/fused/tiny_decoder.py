"""A tiny bf16 Qwen3 built from the SDK's generic decoder, projections merged as the engine
merges them, for the fused decode-kernel tests (the SDK's dense attention: CPU only)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import torch


def tiny_bf16_qwen3(
    tmp_path: Path, device: str
) -> tuple[torch.nn.Module, Callable[[], torch.Tensor]]:
    """The model and a function giving its float32 logits for one token (a decode row)."""
    from engine_sdk.testing import model_parity
    from engine_sdk.testing.dense_attention import DenseAttentionBackend
    from engine_sdk.testing.models import build_tiny_model
    from engine_sdk.testing.quantized_model import MODEL_CLASSES
    from safetensors.torch import load_file
    from transformers import AutoConfig

    model_dir = build_tiny_model(tmp_path, "Qwen3ForCausalLM")
    config = AutoConfig.from_pretrained(str(model_dir))
    weights = load_file(str(model_dir / "model.safetensors")).items()
    model = model_parity.load_float32_model(
        MODEL_CLASSES["Qwen3ForCausalLM"], config, weights, DenseAttentionBackend
    )
    model = model.to(device=device, dtype=torch.bfloat16)
    for layer in model.model.layers:
        layer.self_attn.merge_projections()
        layer.mlp.merge_projections()
    attn = model.model.layers[0].self_attn
    kv = (attn.num_kv_heads, attn.head_dim)

    def logits() -> torch.Tensor:
        return model_parity.model_prefill_logits(model, [42], DenseAttentionBackend, kv).float()

    return model, logits
