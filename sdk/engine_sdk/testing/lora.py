"""Random-weight PEFT LoRA adapters written directly from a model's config (no peft import).

``write_lora_adapter(out, model_dir, rank=8)`` writes ``adapter_config.json`` and
``adapter_model.safetensors`` with PEFT's key names for a Llama-style decoder (Qwen3,
Llama, Mistral, ...): ``base_model.model.model.layers.{i}.{self_attn|mlp}.{target}
.lora_{A|B}.weight``, A ``[rank, in]`` and B ``[out, rank]`` drawn from one seeded
generator, layer by layer, target by target (A before B). Shapes come from the config::

    q_proj    hidden -> heads * head_dim        o_proj     heads * head_dim -> hidden
    k/v_proj  hidden -> kv_heads * head_dim     gate/up    hidden -> intermediate
                                                down_proj  intermediate -> hidden

Needs torch and safetensors. Adapters that PEFT itself saves (to check the engine reads
what PEFT writes) are built with peft in tests/lora/lora_builders.py.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import torch

__all__ = ["LORA_TARGETS", "write_lora_adapter"]

LORA_TARGETS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
_MLP = ("gate_proj", "up_proj", "down_proj")


def _shapes(cfg: Mapping[str, Any]) -> dict[str, tuple[int, int]]:
    """``(in, out)`` of each target projection."""
    hidden, inter = cfg["hidden_size"], cfg["intermediate_size"]
    heads = cfg["num_attention_heads"]
    head_dim = cfg.get("head_dim") or hidden // heads
    q, kv = heads * head_dim, cfg.get("num_key_value_heads", heads) * head_dim
    return {
        "q_proj": (hidden, q), "k_proj": (hidden, kv), "v_proj": (hidden, kv),
        "o_proj": (q, hidden), "gate_proj": (hidden, inter), "up_proj": (hidden, inter),
        "down_proj": (inter, hidden),
    }  # fmt: skip


def write_lora_adapter(
    out: Path,
    model: Path | Mapping[str, Any],
    rank: int,
    *,
    targets: Sequence[str] = LORA_TARGETS,
    seed: int = 0,
    scale: float = 0.3,
    dtype: torch.dtype | None = None,
    base_model_name: str | None = None,
) -> Path:
    """Write a PEFT LoRA folder at ``out`` for ``model`` (a folder with config.json, or the
    config itself): A and B are ``randn * scale`` in ``dtype`` (float32 when None),
    ``lora_alpha = 2 * rank``. Returns ``out``."""
    import torch
    from safetensors.torch import save_file

    cfg = model if isinstance(model, Mapping) else json.loads((model / "config.json").read_text())
    shapes = _shapes(cfg)
    unknown = sorted(set(targets) - set(shapes))
    if unknown:
        raise ValueError(f"write_lora_adapter: no shape for {unknown}; use some of {LORA_TARGETS}")
    gen = torch.Generator().manual_seed(seed)
    tensors = {}
    for layer in range(cfg["num_hidden_layers"]):
        for target in targets:
            n_in, n_out = shapes[target]
            part = "mlp" if target in _MLP else "self_attn"
            key = f"base_model.model.model.layers.{layer}.{part}.{target}"
            a = torch.randn(rank, n_in, generator=gen) * scale
            b = torch.randn(n_out, rank, generator=gen) * scale
            tensors[f"{key}.lora_A.weight"] = a.to(dtype or torch.float32)
            tensors[f"{key}.lora_B.weight"] = b.to(dtype or torch.float32)
    out.mkdir(parents=True, exist_ok=True)
    save_file(tensors, str(out / "adapter_model.safetensors"))
    config: dict[str, Any] = {
        "peft_type": "LORA", "r": rank, "lora_alpha": 2 * rank,
        "target_modules": list(targets), "bias": "none",
    }  # fmt: skip
    if base_model_name is not None:
        config["base_model_name_or_path"] = base_model_name
    (out / "adapter_config.json").write_text(json.dumps(config, indent=2))
    return out
