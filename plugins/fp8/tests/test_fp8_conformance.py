"""Every fp8 layout through the SDK quantization conformance suite (CPU reference path),
plus the FP8-matrix-unit path (``torch._scaled_mm``, which torch also runs on the CPU)."""

from __future__ import annotations

from typing import Any

import pytest
import torch
from engine_fp8.compressed_tensors import CompressedTensorsConfig
from engine_fp8.config import Fp8Config
from engine_sdk.layers.linear import Linear
from engine_sdk.testing.quantization import (
    QUANT_CASES,
    QuantCase,
    Tolerance,
    run_quantization_case,
)
from fp8_formats import (
    DYNAMIC_TOKEN,
    STATIC,
    ct_config,
    per_block,
    per_channel,
    per_tensor,
    with_input_scale,
)

# (id, config class, config, quantizer or None for online)
LAYOUTS = [
    ("online_tensor", Fp8Config, {}, None),
    ("online_channel", Fp8Config, {"weight_strategy": "channel"}, None),
    ("fp8_tensor_dynamic", Fp8Config, {"quant_method": "fp8"}, per_tensor),
    (
        "fp8_tensor_static",
        Fp8Config,
        {"quant_method": "fp8", "activation_scheme": "static"},
        lambda w: with_input_scale(per_tensor(w)),
    ),
    (
        "fp8_block_32",
        Fp8Config,
        {"quant_method": "fp8", "weight_block_size": [32, 32]},
        lambda w: per_block(w, (32, 32), "weight_scale_inv"),
    ),
    (
        "fp8_block_partial_tiles",
        Fp8Config,
        {"quant_method": "fp8", "weight_block_size": [48, 40]},
        lambda w: per_block(w, (48, 40), "weight_scale_inv"),
    ),
    (
        "ct_tensor_dynamic",
        CompressedTensorsConfig,
        ct_config({"strategy": "tensor"}, DYNAMIC_TOKEN),
        lambda w: per_tensor(w, (1,)),
    ),
    (
        "ct_channel_dynamic",
        CompressedTensorsConfig,
        ct_config({"strategy": "channel"}, DYNAMIC_TOKEN),
        per_channel,
    ),
    (
        "ct_tensor_static",
        CompressedTensorsConfig,
        ct_config({"strategy": "tensor"}, STATIC),
        lambda w: with_input_scale(per_tensor(w, (1,))),
    ),
    (
        "ct_channel_weight_only",
        CompressedTensorsConfig,
        ct_config({"strategy": "channel"}, None),
        per_channel,
    ),
    (
        "ct_block",
        CompressedTensorsConfig,
        ct_config({"strategy": "block", "block_structure": [32, 64]}, DYNAMIC_TOKEN),
        lambda w: per_block(w, (32, 64), "weight_scale"),
    ),
]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
@pytest.mark.parametrize("case", QUANT_CASES, ids=lambda c: c.name)
@pytest.mark.parametrize("layout", LAYOUTS, ids=lambda layout: layout[0])
def test_reference_path_conforms(layout: tuple, case: QuantCase, dtype: torch.dtype) -> None:
    _, config_cls, config, quantizer = layout
    run_quantization_case(config_cls, config, case, quantizer=quantizer, dtype=dtype)


def test_suite_catches_a_wrong_scale() -> None:
    """A quantizer whose stored scale is half the real one must fail the suite."""

    def wrong(w: torch.Tensor):  # type: ignore[no-untyped-def]
        q = per_tensor(w)
        tensors = dict(q.tensors, weight_scale=q.tensors["weight_scale"] / 2)
        return type(q)(tensors, q.dequantized)

    with pytest.raises(AssertionError, match="dequantize_weight disagrees"):
        run_quantization_case(Fp8Config, {"quant_method": "fp8"}, QUANT_CASES[0], quantizer=wrong)


# W8A8 on the FP8 matrix path: activations are quantized too, so the stated tolerance is
# the e4m3 rounding of x (3 mantissa bits: <= 2^-4 relative per element) summed over K.
W8A8 = Tolerance(rtol=0.08, atol=1e-3)


def _scaled_mm_layer(config_cls: type, config: dict, quantizer: Any, dtype: torch.dtype) -> Linear:
    quant_config = config_cls.from_config(config)
    layer = Linear(128, 64, True, quant_config, "model.layers.0.self_attn.o_proj", dtype)
    gen = torch.Generator().manual_seed(1)
    w = torch.randn(64, 128, generator=gen) * 0.05
    if quantizer is None:
        layer.weight.data.copy_(w)
    else:
        for name, tensor in quantizer(w).tensors.items():
            param = getattr(layer, name)
            param.weight_loader(param, tensor)
    layer.bias.data.normal_(generator=gen)
    layer.quant_method.process_weights_after_loading(layer)
    assert layer.fp8_use_scaled_mm is False  # CPU: the reference path is the default
    return layer


@pytest.mark.parametrize("num_tokens", [1, 33])
@pytest.mark.parametrize(
    "layout",
    [LAYOUTS[0], LAYOUTS[1], LAYOUTS[2], LAYOUTS[3], LAYOUTS[6], LAYOUTS[7], LAYOUTS[8]],
    ids=lambda layout: layout[0],
)
def test_scaled_mm_path_matches_reference(layout: tuple, num_tokens: int) -> None:
    """Force the ``_scaled_mm`` path (what capability >= 8.9 GPUs run) on the CPU build."""
    _, config_cls, config, quantizer = layout
    dtype = torch.bfloat16
    layer = _scaled_mm_layer(config_cls, config, quantizer, dtype)
    x = torch.randn(num_tokens, 128, generator=torch.Generator().manual_seed(2)).to(dtype)
    with torch.inference_mode():
        reference = layer(x).float()
        layer.fp8_use_scaled_mm = True
        fast = layer(x).float()
    err = (fast - reference).abs().max().item()
    assert err <= W8A8.atol + W8A8.rtol * reference.abs().max().item()
    assert not torch.equal(fast, reference)  # it really took another path (quantized x)


def test_scaled_mm_static_scale_is_used() -> None:
    """A static input_scale far too small saturates activations: the output must change."""
    quantizer = LAYOUTS[3][3]
    layer = _scaled_mm_layer(Fp8Config, LAYOUTS[3][2], quantizer, torch.bfloat16)
    layer.fp8_use_scaled_mm = True
    x = torch.randn(4, 128).to(torch.bfloat16)
    with torch.inference_mode():
        good = layer(x).float()
        layer.input_scale.data.fill_(1e-4)  # |x| / 1e-4 >> 448: clamps everything
        saturated = layer(x).float()
    assert (good - saturated).abs().max() > 0.1
