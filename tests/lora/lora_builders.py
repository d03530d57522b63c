"""Random-weight PEFT adapters for a tiny model, and the transformers + PEFT reference."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import torch

# `engine serve` in a subprocess, and the flags every CPU server test of a tiny model takes
ENGINE = [sys.executable, "-m", "engine.cli.main"]
CPU_SERVE_FLAGS = [
    "--device", "cpu", "--dtype", "float32", "--max-model-len", "256",
    "--kv-cache-memory-bytes", str(4 * 1024 * 1024), "--served-model-name", "tiny",
]  # fmt: skip


def build_adapter(
    model_dir: Path, out: Path, rank: int, targets: list[str], seed: int, alpha: int | None = None
) -> Path:
    """A PEFT LoRA folder (adapter_config.json + adapter_model.safetensors) with random A
    and B large enough to change greedy tokens."""
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    base = AutoModelForCausalLM.from_pretrained(str(model_dir), dtype=torch.float32)
    config = LoraConfig(
        r=rank, lora_alpha=alpha or 2 * rank, target_modules=targets, init_lora_weights=False
    )
    model = get_peft_model(base, config)
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, param in model.named_parameters():
            if "lora_" in name:
                param.copy_(torch.randn(param.shape, generator=gen) * 0.3)
    model.save_pretrained(str(out))
    return out


def hf_lora_greedy(
    model_dir: Path, adapter_dir: Path | None, prompt: list[int], max_new_tokens: int
) -> list[int]:
    """Greedy tokens of transformers with the adapter merged into the weights."""
    from transformers import AutoModelForCausalLM

    model: Any = AutoModelForCausalLM.from_pretrained(str(model_dir), dtype=torch.float32)
    if adapter_dir is not None:
        from peft import PeftModel

        model = PeftModel.from_pretrained(model, str(adapter_dir)).merge_and_unload()
    model.eval()
    with torch.no_grad():
        ids = torch.tensor([prompt])
        out = model.generate(
            ids,
            attention_mask=torch.ones_like(ids),
            max_new_tokens=max_new_tokens,
            do_sample=False,
            pad_token_id=0,
        )
    return list(out[0, len(prompt) :].tolist())
