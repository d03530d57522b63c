"""The SDK's direct PEFT writer (``engine_sdk.testing.lora``, used by the kernel test and
the GPU benchmark) writes folders that PEFT loads with the same weights."""

from __future__ import annotations

from pathlib import Path

import torch
from engine_sdk.testing.lora import write_lora_adapter


def test_peft_loads_the_written_adapter(qwen3_lora_model: Path, tmp_path: Path) -> None:
    from peft import PeftModel
    from safetensors.torch import load_file
    from transformers import AutoModelForCausalLM

    out = write_lora_adapter(tmp_path / "a", qwen3_lora_model, 4, seed=3)
    base = AutoModelForCausalLM.from_pretrained(str(qwen3_lora_model), dtype=torch.float32)
    model = PeftModel.from_pretrained(base, str(out))
    params = dict(model.named_parameters())
    written = load_file(str(out / "adapter_model.safetensors"))
    assert len(written) == 2 * 7 * base.config.num_hidden_layers
    for key, tensor in written.items():
        name = key.replace(".lora_A.weight", ".lora_A.default.weight")
        name = name.replace(".lora_B.weight", ".lora_B.default.weight")
        assert torch.equal(params[name].detach(), tensor), key
    assert model.peft_config["default"].r == 4 and model.peft_config["default"].lora_alpha == 8
