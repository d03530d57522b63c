"""The whole model with LoRA through the Triton kernels (interpreter on CPU) gives the same
greedy tokens as through the torch reference (itself checked against transformers + PEFT
in tests/lora): a 150-token prompt (the blocked prefill kernels) and decode steps (the
per-token kernels), two adapters and the base model in one batch."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from engine_sdk.layers import lora
from engine_sdk.testing.lora import write_lora_adapter
from engine_sdk.testing.models import build_tiny_model

# The interpreter on a CPU-only machine; the compiled kernels where a GPU is (Triton cannot
# run compiled kernels on CPU tensors, and the interpreter is off there).
DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


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
    a = LoRARequest("a", 1, str(write_lora_adapter(tmp_path / "a", model, 8, seed=1)))
    b = LoRARequest("b", 2, str(write_lora_adapter(tmp_path / "b", model, 16, seed=2)))
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
