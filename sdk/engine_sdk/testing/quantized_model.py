"""A tiny Qwen3 / Llama built through the SDK with quantized linear layers, and greedy
decoding by repeated prefill (the SDK's dense test attention, CPU, float32). Needs
``engine-sdk`` alone: the models are the SDK's generic decoder configured as the Qwen3 and
Llama plugins configure it, the attention is ``engine_sdk.testing.dense_attention``.

``quantizer`` maps a projection's float32 weight [out, in] to its checkpoint tensors
(``None``: keep the float weight, for online quantization; see the fp8 and AWQ plugin tests).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, ClassVar

import torch

from engine_sdk.interfaces.quantization import QuantizationConfig, QuantizationMethod
from engine_sdk.layers.decoder import DecoderForCausalLM, DecoderOptions
from engine_sdk.testing.dense_attention import DenseAttentionBackend
from engine_sdk.testing.model_parity import load_float32_model, model_prefill_logits
from engine_sdk.testing.quantization import Quantizer


class _Qwen3(DecoderForCausalLM):
    options: ClassVar[DecoderOptions] = DecoderOptions(qk_norm=True)


class _Llama(DecoderForCausalLM):
    options: ClassVar[DecoderOptions] = DecoderOptions()


MODEL_CLASSES: dict[str, type[DecoderForCausalLM]] = {
    "Qwen3ForCausalLM": _Qwen3,
    "LlamaForCausalLM": _Llama,
}
PROJECTIONS = tuple(
    f"{p}.weight"
    for p in ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
)
BLOCK_SIZE = 4


def quantized_state(model_dir: Path, quantizer: Quantizer | None) -> dict[str, torch.Tensor]:
    from safetensors.torch import load_file

    state = load_file(str(model_dir / "model.safetensors"))
    out: dict[str, torch.Tensor] = {}
    for name, tensor in state.items():
        if quantizer is None or not name.endswith(PROJECTIONS):
            out[name] = tensor
            continue
        prefix = name[: -len("weight")]
        for param_name, value in quantizer(tensor.float()).tensors.items():
            out[prefix + param_name] = value
    return out


def build_model(
    model_dir: Path, quant_config: QuantizationConfig, state: dict[str, torch.Tensor]
) -> Any:
    """The model with every parameter loaded and every quantized layer processed."""
    from transformers import AutoConfig

    config: Any = AutoConfig.from_pretrained(str(model_dir))
    model_cls = MODEL_CLASSES[config.architectures[0]]
    model = load_float32_model(
        model_cls, config, state.items(), DenseAttentionBackend, BLOCK_SIZE, quant_config
    )
    for module in model.modules():
        if isinstance(getattr(module, "quant_method", None), QuantizationMethod):
            module.quant_method.process_weights_after_loading(module)
    return model


def greedy(model: Any, prompt: list[int], num_new: int) -> tuple[list[int], torch.Tensor]:
    """Greedy tokens and the last-position logits of every step [num_new, vocab]."""
    attn: Any = model.model.layers[0].self_attn
    kv_shape = (attn.num_kv_heads, attn.head_dim)
    ids, steps = list(prompt), []
    for _ in range(num_new):
        logits = model_prefill_logits(model, ids, DenseAttentionBackend, kv_shape, BLOCK_SIZE)
        steps.append(logits[-1])
        ids.append(int(logits[-1].argmax()))
    return ids[len(prompt) :], torch.stack(steps)
