"""Merging fp8 projections (q/k/v, gate/up) into one layer, and the Triton activation
quantization kernels (Triton's interpreter on a CPU, the real kernels on a GPU).

Merged layers must compute exactly what the separate layers compute, concatenated; the
kernels must produce the same fp8 bytes and scales as the torch reference.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from engine_fp8 import quant_ops, triton_quant
from engine_fp8.compressed_tensors import CompressedTensorsConfig
from engine_fp8.config import Fp8Config
from engine_fp8.method import Fp8LinearMethod
from engine_sdk.layers.linear import Linear, merge_linears
from engine_sdk.testing.models import build_tiny_model
from engine_sdk.testing.quantization import quantized_linears
from engine_sdk.testing.quantized_model import build_model, greedy, quantized_state
from fp8_formats import (
    DYNAMIC_TENSOR,
    DYNAMIC_TOKEN,
    ct_config,
    per_block,
    per_channel,
    per_tensor,
    with_input_scale,
)

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


# (id, config class, config, quantizer or None for online)
LAYOUTS = [
    ("online_tensor", Fp8Config, {}, None),
    ("online_channel_token", Fp8Config, {"weight_strategy": "channel"}, None),
    ("fp8_tensor_dynamic", Fp8Config, {"quant_method": "fp8"}, per_tensor),
    (
        "fp8_tensor_static",
        Fp8Config,
        {"quant_method": "fp8", "activation_scheme": "static"},
        lambda w: with_input_scale(per_tensor(w)),
    ),
    (
        "fp8_block",
        Fp8Config,
        {"quant_method": "fp8", "weight_block_size": [32, 32]},
        lambda w: per_block(w, (32, 32), "weight_scale_inv"),
    ),
    (
        "ct_channel_token",
        CompressedTensorsConfig,
        ct_config({"strategy": "channel"}, DYNAMIC_TOKEN),
        per_channel,
    ),
    (
        "ct_tensor_tensor",
        CompressedTensorsConfig,
        ct_config({"strategy": "tensor"}, DYNAMIC_TENSOR),
        lambda w: per_tensor(w, (1,)),
    ),
    (
        "ct_channel_weight_only",
        CompressedTensorsConfig,
        ct_config({"strategy": "channel"}, None),
        per_channel,
    ),
]
BY_ID = {layout[0]: layout for layout in LAYOUTS}
# Different magnitudes per layer, so per-tensor scales differ and a mixed-up scale shows.
SIZES_AND_GAINS = ((64, 1.0), (32, 4.0), (48, 0.25))


def _layers(
    layout: tuple,
    sizes_and_gains: tuple[tuple[int, float], ...] = SIZES_AND_GAINS,
    bias: bool = False,
    dtype: torch.dtype = torch.float32,
) -> list[Linear]:
    _, config_cls, config, quantizer = layout
    quant_config = config_cls.from_config(config)
    return quantized_linears(
        quant_config, quantizer, sizes_and_gains, bias=bias, dtype=dtype, device=DEVICE
    )


def _x(num_tokens: int, dtype: torch.dtype, num_in: int = 128) -> torch.Tensor:
    return torch.randn(num_tokens, num_in, generator=torch.Generator().manual_seed(1)).to(
        DEVICE, dtype
    )


def _separate(layers: list[Linear], x: torch.Tensor) -> torch.Tensor:
    with torch.inference_mode():
        return torch.cat([layer(x) for layer in layers], dim=-1)


# -- merged == concatenation of the separate layers ----------------------------------------


@pytest.mark.parametrize("bias", [False, True])
@pytest.mark.parametrize("layout", LAYOUTS, ids=lambda layout: layout[0])
def test_merged_equals_concatenation(layout: tuple, bias: bool) -> None:
    """The dequantizing path (CPU, GPUs without FP8 units, block layouts)."""
    layers = _layers(layout, bias=bias)
    for layer in layers:
        layer.fp8_use_scaled_mm = layer.fp8_triton_quant = False
    x = _x(5, torch.float32)
    expected = _separate(layers, x)
    merged = merge_linears(layers)
    assert merged is not None and merged.output_size == 144
    assert isinstance(merged.quant_method, Fp8LinearMethod)
    with torch.inference_mode():
        got = merged(x)
        after = _separate(layers, x)
    torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-6)
    # The originals view the merged fp8 weight and compute exactly what they did before.
    assert torch.equal(after, expected)
    ptr = merged.weight.untyped_storage().data_ptr()
    assert all(layer.weight.untyped_storage().data_ptr() == ptr for layer in layers)
    assert merged.weight.untyped_storage().nbytes() == 144 * 128  # one byte per weight


SCALED_MM_LAYOUTS = [
    "online_tensor",
    "online_channel_token",
    "fp8_tensor_dynamic",
    "fp8_tensor_static",
    "ct_channel_token",
    "ct_tensor_tensor",
]


@pytest.mark.parametrize("num_tokens", [1, 19])
@pytest.mark.parametrize("layout_id", SCALED_MM_LAYOUTS)
def test_merged_scaled_mm_path_equals_concatenation(layout_id: str, num_tokens: int) -> None:
    """The FP8-matrix-unit path (``_scaled_mm`` with row-wise weight scales after merging;
    torch runs it on the CPU build), activations quantized by the Triton kernels."""
    layers = _layers(BY_ID[layout_id], bias=True, dtype=torch.bfloat16)
    for layer in layers:
        layer.fp8_use_scaled_mm = layer.fp8_triton_quant = True
    x = _x(num_tokens, torch.bfloat16)
    expected = _separate(layers, x).float()
    merged = merge_linears(layers)
    assert merged is not None and merged.fp8_use_scaled_mm and merged.fp8_triton_quant
    assert merged.weight_scale.shape == (144, 1)  # per-tensor scales became per channel
    with torch.inference_mode():
        got = merged(x).float()
    # Same quantized activations and weights; only the bf16 rounding of the output may differ.
    err = (got - expected).abs().max().item()
    assert err <= 1e-2 * expected.abs().max().item(), err


def test_channel_scales_are_the_layers_scales_in_order() -> None:
    layers = _layers(BY_ID["fp8_tensor_dynamic"])
    scales = [layer.weight_scale.item() for layer in layers]
    merged = merge_linears(layers)
    assert merged is not None
    rows = merged.weight_scale.reshape(-1).tolist()
    assert rows == [scales[0]] * 64 + [scales[1]] * 32 + [scales[2]] * 48


# -- refusals ----------------------------------------------------------------------------


def _unchanged(layers: list[Linear], weights: list[torch.Tensor]) -> bool:
    return all(layer.weight is w for layer, w in zip(layers, weights, strict=True))


def test_static_input_scales_must_be_equal() -> None:
    layers = _layers(BY_ID["fp8_tensor_static"])
    layers[1].input_scale.data.fill_(0.07)
    weights = [layer.weight for layer in layers]
    assert merge_linears(layers) is None
    assert _unchanged(layers, weights)  # a refusal leaves the layers as they were


def test_block_layers_must_fill_whole_blocks() -> None:
    layout = BY_ID["fp8_block"]
    assert merge_linears(_layers(layout, ((64, 1.0), (48, 2.0)))) is not None  # last partial
    assert merge_linears(_layers(layout, ((48, 1.0), (64, 2.0)))) is None


def test_mixed_layers_are_refused() -> None:
    tensor, channel = _layers(BY_ID["online_tensor"]), _layers(BY_ID["online_channel_token"])
    assert merge_linears([tensor[0], channel[1]]) is None  # different schemes
    plain = Linear(128, 32, False, None, "plain").to(DEVICE)
    assert merge_linears([tensor[0], plain]) is None  # fp8 and unquantized
    assert merge_linears([plain, tensor[0]]) is None
    tensor[1].fp8_use_scaled_mm = not tensor[0].fp8_use_scaled_mm
    assert merge_linears(tensor) is None  # different matmul paths


# -- the activation quantization kernels ----------------------------------------------------


def _activations(num_rows: int, num_cols: int, dtype: torch.dtype) -> torch.Tensor:
    gen = torch.Generator().manual_seed(num_rows * 1000 + num_cols)
    x = torch.randn(num_rows, num_cols, generator=gen) * 3
    x[0, num_cols // 2] = 2000.0  # an outlier: most of its row rounds to small values
    if num_rows > 2:
        x[1] = 0.0  # amax 0: the scale's lower clamp
        x[2] *= 1e-9  # tiny values: subnormal fp8 results
    return x.to(DEVICE, dtype)


def _bytes(q: torch.Tensor) -> torch.Tensor:
    assert q.dtype == torch.float8_e4m3fn
    return q.view(torch.uint8).cpu()


# 5000 > MAX_BLOCK: the chunked loop; over SMALL_TENSOR_ROWS rows: the atomic maximum.
SHAPES = [(1, 64), (7, 100), (3, 4096), (4, 5000), (12, 300), (10, 4100)]


@pytest.mark.parametrize("shape", SHAPES, ids=str)
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32], ids=str)
def test_per_token_kernel_is_bit_exact(dtype: torch.dtype, shape: tuple[int, int]) -> None:
    x = _activations(*shape, dtype)
    q, scale = triton_quant.quantize_per_token(x)
    ref_q, ref_scale = quant_ops.quantize_per_token(x)
    assert scale.shape == (shape[0], 1) and scale.dtype == torch.float32
    assert torch.equal(_bytes(q), _bytes(ref_q))
    assert torch.equal(scale.cpu(), ref_scale.cpu())


@pytest.mark.parametrize("shape", SHAPES, ids=str)
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32], ids=str)
def test_per_tensor_and_static_kernels_are_bit_exact(
    dtype: torch.dtype, shape: tuple[int, int]
) -> None:
    x = _activations(*shape, dtype)
    q, scale = triton_quant.quantize_per_tensor(x)
    ref_q, ref_scale = quant_ops.quantize_per_tensor(x)
    assert torch.equal(_bytes(q), _bytes(ref_q))
    assert torch.equal(scale.cpu().reshape(-1), ref_scale.cpu().reshape(-1))
    static = torch.tensor([0.01], device=DEVICE)  # saturates the large values
    got = triton_quant.quantize_with_scale(x, static)
    assert torch.equal(_bytes(got), _bytes(quant_ops.quantize_with_scale(x, static)))


@pytest.mark.parametrize("shape", [(5, 64), (20, 64)], ids=str)
def test_row_scales_repeat_the_one_scale(shape: tuple[int, int]) -> None:
    """``row_scales``: the per-tensor / static scale written once per row, same fp8 bytes."""
    x = _activations(*shape, torch.bfloat16)
    q, scale = triton_quant.quantize(x, "tensor", row_scales=True)
    ref_q, ref_scale = quant_ops.quantize_per_tensor(x)
    assert scale.shape == (shape[0], 1) and torch.equal(_bytes(q), _bytes(ref_q))
    assert torch.equal(scale.cpu(), ref_scale.cpu().expand(shape[0], 1))
    static = torch.tensor([0.02], device=DEVICE)
    q, scale = triton_quant.quantize(x, "static", static, row_scales=True)
    assert torch.equal(_bytes(q), _bytes(quant_ops.quantize_with_scale(x, static)))
    assert torch.equal(scale.cpu(), torch.full((shape[0], 1), 0.02))


def test_kernel_reads_strided_rows() -> None:
    wide = _activations(5, 96, torch.bfloat16)
    x = wide[:, 16:80]  # rows 96 apart
    q, scale = triton_quant.quantize_per_token(x)
    ref_q, ref_scale = quant_ops.quantize_per_token(x)
    assert torch.equal(_bytes(q), _bytes(ref_q)) and torch.equal(scale.cpu(), ref_scale.cpu())


@pytest.mark.parametrize("layout_id", ["online_tensor", "fp8_tensor_static", "ct_channel_token"])
def test_layer_output_is_the_same_with_the_kernel(layout_id: str) -> None:
    (layer,) = _layers(BY_ID[layout_id], ((64, 1.0),), dtype=torch.bfloat16)
    layer.fp8_use_scaled_mm = True
    x = _x(9, torch.bfloat16)
    with torch.inference_mode():
        layer.fp8_triton_quant = False
        torch_ops = layer(x)
        layer.fp8_triton_quant = True
        kernel = layer(x)
    assert torch.equal(kernel, torch_ops)


# -- a whole model: merging changes no token -----------------------------------------------

MODEL_CASES = [
    ("Qwen3ForCausalLM", "online_tensor", False),
    ("Qwen3ForCausalLM", "online_tensor", True),
    ("Qwen3ForCausalLM", "fp8_tensor_static", True),
    ("Qwen3ForCausalLM", "fp8_block", False),
    ("LlamaForCausalLM", "ct_channel_token", True),
]
PROMPT = [5, 17, 42, 99, 3, 250, 7, 8]


@pytest.mark.parametrize(("arch", "layout_id", "scaled_mm"), MODEL_CASES, ids=str)
def test_tiny_model_gives_the_same_tokens_merged(
    arch: str, layout_id: str, scaled_mm: bool, tmp_path: Path
) -> None:
    """Greedy tokens and logits of a tiny fp8 model with q/k/v and gate/up merged and not
    (``scaled_mm``: the W8A8 path that FP8 GPUs take, forced on torch's CPU build)."""
    if DEVICE != "cpu":
        pytest.skip("builds the model on the CPU")
    _, config_cls, config, quantizer = BY_ID[layout_id]
    model_dir = build_tiny_model(tmp_path / "m", arch, seed=3)
    state = quantized_state(model_dir, quantizer)
    models = [build_model(model_dir, config_cls.from_config(config), state) for _ in range(2)]
    for model in models:
        for module in model.modules():
            if isinstance(module, Linear) and isinstance(module.quant_method, Fp8LinearMethod):
                module.fp8_use_scaled_mm = scaled_mm
    separate, merged = models
    merged.merge_projections()
    for layer in merged.model.layers:
        assert layer.self_attn.qkv_proj is not None and layer.mlp.gate_up_proj is not None
    assert separate.model.layers[0].self_attn.qkv_proj is None
    tokens, logits = greedy(separate, PROMPT, 8)
    merged_tokens, merged_logits = greedy(merged, PROMPT, 8)
    assert merged_tokens == tokens
    torch.testing.assert_close(merged_logits, logits, rtol=1e-4, atol=1e-4)
