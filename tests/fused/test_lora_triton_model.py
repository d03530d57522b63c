"""The whole model with LoRA through the Triton kernels (interpreter on CPU) gives the same
greedy tokens as through the torch reference (itself checked against transformers + PEFT
in tests/lora): a 150-token prompt (the blocked prefill kernels) and decode steps (the
per-token kernels), two adapters and the base model in one batch."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from engine_sdk.layers import lora
from engine_sdk.testing.models import build_tiny_model

# The interpreter on a CPU-only machine; the compiled kernels where a GPU is (Triton cannot
# run compiled kernels on CPU tensors, and the interpreter is off there).
DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
TARGETS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


def _write_adapter(model_dir: Path, out: Path, rank: int, seed: int) -> Path:
    from safetensors.torch import save_file

    cfg = json.loads((model_dir / "config.json").read_text())
    hidden, inter = cfg["hidden_size"], cfg["intermediate_size"]
    q, kv = (
        cfg["num_attention_heads"] * cfg["head_dim"],
        cfg["num_key_value_heads"] * cfg["head_dim"],
    )
    shapes = {
        "q_proj": (hidden, q), "k_proj": (hidden, kv), "v_proj": (hidden, kv),
        "o_proj": (q, hidden), "gate_proj": (hidden, inter), "up_proj": (hidden, inter),
        "down_proj": (inter, hidden),
    }  # fmt: skip
    gen = torch.Generator().manual_seed(seed)
    tensors = {}
    for layer in range(cfg["num_hidden_layers"]):
        for target in TARGETS:
            n_in, n_out = shapes[target]
            part = "mlp" if target in ("gate_proj", "up_proj", "down_proj") else "self_attn"
            key = f"base_model.model.model.layers.{layer}.{part}.{target}"
            tensors[f"{key}.lora_A.weight"] = torch.randn(rank, n_in, generator=gen) * 0.3
            tensors[f"{key}.lora_B.weight"] = torch.randn(n_out, rank, generator=gen) * 0.3
    out.mkdir(parents=True)
    save_file(tensors, str(out / "adapter_model.safetensors"))
    config = {
        "peft_type": "LORA",
        "r": rank,
        "lora_alpha": 2 * rank,
        "target_modules": list(TARGETS),
    }
    (out / "adapter_config.json").write_text(json.dumps(config))
    return out


def _generate(model: Path, loras: list, prompts: list[list[int]]) -> list[list[int]]:
    from engine import LLM, SamplingParams

    llm = LLM(
        str(model), device=DEVICE, dtype="float32", kv_cache_memory_bytes=4 << 20,
        enable_lora=True, max_loras=2, max_lora_rank=16,
    )  # fmt: skip
    params = SamplingParams(temperature=0.0, max_tokens=4, ignore_eos=True)
    outs = llm.generate(prompts, params, use_tqdm=False, lora_request=loras)
    return [list(o.outputs[0].token_ids) for o in outs]


def test_triton_kernels_match_the_reference_in_the_model(tmp_path: Path, monkeypatch) -> None:
    from engine import LoRARequest

    model = build_tiny_model(tmp_path / "m", "Qwen3ForCausalLM", seed=4)
    a = LoRARequest("a", 1, str(_write_adapter(model, tmp_path / "a", 8, 1)))
    b = LoRARequest("b", 2, str(_write_adapter(model, tmp_path / "b", 16, 2)))
    prompts = [[(5 * i + j) % 300 + 1 for i in range(150)] for j in range(3)] + [[3, 4, 5]]
    loras = [a, b, None, a]

    def run(mode: str) -> list[list[int]]:
        monkeypatch.setenv("ENGINE_LORA_KERNELS", mode)
        lora._kernels.cache_clear()
        lora._forced.cache_clear()
        try:
            return _generate(model, loras, prompts)
        finally:
            lora._kernels.cache_clear()
            lora._forced.cache_clear()

    calls = {"shrink": 0}
    original = lora.lora_shrink_triton

    def counting(*args, **kwargs):  # type: ignore[no-untyped-def]
        calls["shrink"] += 1
        return original(*args, **kwargs)

    reference = run("1")
    assert calls["shrink"] == 0
    monkeypatch.setattr(lora, "lora_shrink_triton", counting)
    with_kernels = run("force")
    assert calls["shrink"] > 0  # the kernels ran
    assert with_kernels == reference


@pytest.fixture(autouse=True)
def _clear_caches():
    yield
    lora._kernels.cache_clear()
    lora._forced.cache_clear()
