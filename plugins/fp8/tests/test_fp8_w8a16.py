"""The weight-only FP8 GEMM (W8A16) for few tokens (Triton's interpreter on a CPU, the
real kernel on a GPU): equal to the dequantized-weight matmul for tensor, channel and block
scales, picked by layers for decode batches, and the same for merged layers."""

from __future__ import annotations

import pytest
import torch
from engine_fp8 import gemv, method, w8a16
from engine_fp8.compressed_tensors import CompressedTensorsConfig
from engine_fp8.config import Fp8Config
from engine_fp8.method import (
    W8A16_DENSE_MAX_TOKENS,
    W8A16_FMA_MAX_TOKENS,
    W8A16_MAX_TOKENS,
    _add_gemv_locks,
    select_path,
)
from engine_fp8.w8a16 import GemmConfig, default_config, fp8_w8a16_gemm
from engine_sdk.layers.linear import Linear, merge_linears
from engine_sdk.testing.quantization import quantized_linears
from fp8_formats import DYNAMIC_TOKEN, ct_config, per_block, per_channel, per_tensor

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"

QUANTIZERS = {
    "tensor": (per_tensor, None),
    "channel": (per_channel, None),
    "block": (lambda w: per_block(w, (32, 64), "weight_scale_inv"), (32, 64)),
}


def _weights(kind: str, num_out: int, num_in: int, seed: int = 0) -> tuple:
    weight = torch.randn(num_out, num_in, generator=torch.Generator().manual_seed(seed)) * 0.05
    quantizer, block = QUANTIZERS[kind]
    fmt = quantizer(weight)
    q = fmt.tensors["weight"].to(DEVICE)
    scale = next(v for k, v in fmt.tensors.items() if k != "weight").float().to(DEVICE)
    return q, scale, block, fmt.dequantized


def _x(num_tokens: int, num_in: int, dtype: torch.dtype, seed: int = 1) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    return torch.randn(num_tokens, num_in, generator=gen).to(DEVICE, dtype)


def _rel_err(got: torch.Tensor, want: torch.Tensor) -> float:
    got, want = got.double().cpu(), want.double().cpu()
    return float((got - want).abs().max() / want.abs().max())


# (tokens, K, N, config): K 200 leaves a partial last step, N 72 a partial tile.
GEMM_CASES = [
    (1, 256, 64, GemmConfig("fma", 1, 64, 64)),
    (1, 256, 72, GemmConfig("fma", 1, 32, 32, split=3)),
    (3, 200, 64, GemmConfig("fma", 4, 32, 64, split=2)),
    (8, 256, 80, GemmConfig("dot", 16, 32, 64)),
    (16, 384, 64, GemmConfig("dot", 16, 64, 64, split=3)),
    (19, 256, 64, GemmConfig("dot", 32, 32, 32, split=2)),
]


# Output rounding relative to the largest output: fp16 2^-11, bf16 2^-8, with margin.
TOLERANCE = {torch.float16: 2e-3, torch.bfloat16: 1e-2}


@pytest.mark.parametrize(("num_tokens", "num_in", "num_out", "config"), GEMM_CASES)
@pytest.mark.parametrize("kind", ["tensor", "channel", "block"])
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=str)
def test_gemm_equals_dequantized_reference(
    kind: str, num_tokens: int, num_in: int, num_out: int, config: GemmConfig, dtype: torch.dtype
) -> None:
    q, scale, block, dequantized = _weights(kind, num_out, num_in)
    x = _x(num_tokens, num_in, dtype)
    bias = torch.randn(num_out, generator=torch.Generator().manual_seed(3)).to(DEVICE)
    out = fp8_w8a16_gemm(x, q, scale, block, bias, config)
    want = x.double().cpu() @ dequantized.double().t() + bias.double().cpu()
    assert out.shape == (num_tokens, num_out) and out.dtype == dtype
    assert _rel_err(out, want) <= TOLERANCE[dtype]


def test_gemm_partial_scale_blocks_and_float32() -> None:
    """Scale blocks that do not tile the weight (50 rows, 2 row blocks of 32) in float32."""
    if DEVICE != "cpu":
        pytest.skip("float32 dots are TF32 on a GPU")
    weight = torch.randn(50, 128, generator=torch.Generator().manual_seed(5)) * 0.05
    fmt = per_block(weight, (32, 32), "weight_scale_inv")
    x = _x(5, 128, torch.float32)
    want = x.double() @ fmt.dequantized.double().t()
    for config in (GemmConfig("fma", 8, 16, 32), GemmConfig("dot", 16, 32, 32, split=2)):
        t = fmt.tensors
        out = fp8_w8a16_gemm(x, t["weight"], t["weight_scale_inv"], (32, 32), None, config)
        assert _rel_err(out, want) <= 1e-6


def test_default_config_fits_the_scale_block() -> None:
    assert default_config(1, 4096, "fma").block_k == 64
    assert default_config(8, 4096, "dot", (128, 128)).block_k == 128
    assert default_config(8, 4096, "dot", (128, 48)).block_k == 16


# -- the layer's choice ----------------------------------------------------------------------

LAYOUTS = {
    "online_tensor": (Fp8Config, {}, None),
    "ct_channel_token": (
        CompressedTensorsConfig,
        ct_config({"strategy": "channel"}, DYNAMIC_TOKEN),
        per_channel,
    ),  # noqa: E501
    "fp8_block": (
        Fp8Config,
        {"quant_method": "fp8", "weight_block_size": [32, 64]},
        QUANTIZERS["block"][0],
    ),  # noqa: E501
}


def _layers(layout: str, sizes: tuple[tuple[int, float], ...], bias: bool = True) -> list[Linear]:
    config_cls, config, quantizer = LAYOUTS[layout]
    layers = quantized_linears(
        config_cls.from_config(config), quantizer, sizes, bias=bias, dtype=torch.float16,
        device=DEVICE,
    )  # fmt: skip
    for layer in layers:  # on a CPU: as an FP8 GPU would set them (torch runs _scaled_mm)
        if DEVICE == "cpu":
            layer.fp8_use_scaled_mm = layer.quant_method.scheme.weight_strategy != "block"
            layer.fp8_triton_quant = layer.fp8_use_scaled_mm
            layer.fp8_w8a16 = True
            _add_gemv_locks(layer, layer.weight.shape[0], layer.weight.device)
        assert layer.fp8_w8a16
    return layers


@pytest.fixture
def ran(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The weight-only kernels that ran, in order: "gemv" (engine_fp8.gemv, with the
    layer's split-K counters) or the W8A16 GEMM's variant ("fma" / "dot")."""
    calls: list[str] = []
    real, real_gemv = w8a16.fp8_w8a16_gemm, gemv.fp8_gemv

    def spy(*args, **kwargs):  # type: ignore[no-untyped-def]
        calls.append(args[5].variant)
        return real(*args, **kwargs)

    def gemv_spy(*args, **kwargs):  # type: ignore[no-untyped-def]
        assert args[6] is not None  # the layer's counters: no memset per call
        calls.append("gemv")
        return real_gemv(*args, **kwargs)

    monkeypatch.setattr(w8a16, "fp8_w8a16_gemm", spy)
    monkeypatch.setattr(gemv, "fp8_gemv", gemv_spy)
    return calls


GEMV_MAX_TOKENS = 16  # the split-K GEMV's limit (the default; ENGINE_QUANT_GEMV=0: 0)


@pytest.mark.parametrize("layout", list(LAYOUTS))
def test_layer_picks_w8a16_for_decode(
    layout: str, ran: list[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(method, "GEMV_MAX_TOKENS", GEMV_MAX_TOKENS)  # as by default
    (layer,) = _layers(layout, ((64, 1.0),))
    dense = layout == "fp8_block"  # no _scaled_mm path: W8A16 up to the dense limit
    big = (W8A16_DENSE_MAX_TOKENS if dense else W8A16_MAX_TOKENS) + 1
    after_gemv = ["dot"] if dense else []  # 17 tokens: the W8A16 GEMM or _scaled_mm
    cases = [(1, ["gemv"]), (GEMV_MAX_TOKENS, ["gemv"]), (GEMV_MAX_TOKENS + 1, after_gemv)]
    cases += [(big, [])]
    reference = layer.quant_method.dequantize_weight(layer, torch.float64)

    def check(num_tokens: int, variants: list[str]) -> None:
        ran.clear()
        x = _x(num_tokens, 128, torch.float16, seed=num_tokens)
        path = "gemv" if variants == ["gemv"] else "w8a16" if variants else None
        assert select_path(layer, num_tokens, x.dtype) == (
            path or ("reference" if dense else "scaled_mm")
        )
        with torch.inference_mode():
            out = layer(x)
        assert ran == variants, (num_tokens, ran)
        if variants:  # weight-only: exactly the dequantized weight's product
            want = x.double().cpu() @ reference.cpu().t() + layer.bias.double().cpu()
            assert _rel_err(out, want) <= 2e-3

    for num_tokens, variants in cases:
        check(num_tokens, variants)
    assert not layer.gemv_locks.any()  # back to zero after every call
    # The W8A16 GEMM's own variants, reached when the GEMV's range is lowered.
    monkeypatch.setattr(method, "GEMV_MAX_TOKENS", 1)
    check(W8A16_FMA_MAX_TOKENS, ["fma"])
    check(W8A16_FMA_MAX_TOKENS + 1, ["dot"])
    check(W8A16_MAX_TOKENS, ["dot"])
    assert select_path(layer, 2, torch.float32) not in ("gemv", "w8a16")  # fp16/bf16 only


@pytest.mark.parametrize("layout", list(LAYOUTS))
def test_merged_w8a16_equals_concatenation(layout: str, ran: list[str]) -> None:
    """Merged per-tensor layers become per-channel; the kernel costs them nothing more."""
    layers = _layers(layout, ((64, 1.0), (32, 4.0), (64, 0.25)))
    xs = [_x(num_tokens, 128, torch.float16) for num_tokens in (1, 8)]  # fma, dot
    with torch.inference_mode():
        expected = [torch.cat([layer(x) for layer in layers], dim=-1).float() for x in xs]
    merged = merge_linears(layers)
    assert merged is not None and merged.fp8_w8a16
    for x, want in zip(xs, expected, strict=True):
        ran.clear()
        with torch.inference_mode():
            got = merged(x).float()
        assert len(ran) == 1
        assert (got - want).abs().max().item() <= 2e-3 * want.abs().max().item()


@pytest.mark.parametrize("layout", ["ct_channel_token", "fp8_block"])
@pytest.mark.parametrize("num_tokens", [1, 4, 5])
def test_layer_fuses_add_rms_norm_up_to_four_rows(layout: str, num_tokens: int) -> None:
    """``Fp8LinearMethod.apply_add_rms_norm`` (what the decoder calls before q/k/v and
    gate/up): up to four rows it returns the layer's output on ``add_rms_norm(x,
    residual)`` and the new residual, from one kernel; above, None."""
    from engine_sdk.layers import fused_ops

    (layer,) = _layers(layout, ((64, 1.0),))
    x = _x(num_tokens, 128, torch.float16, seed=3)
    residual = _x(num_tokens, 128, torch.float16, seed=4)
    norm_weight = (1 + 0.1 * _x(1, 128, torch.float16, seed=5)).reshape(128)
    with torch.inference_mode():
        pair = layer.quant_method.apply_add_rms_norm(
            layer, x, residual, norm_weight, 1e-6, layer.bias
        )
        normed, summed = fused_ops.add_rms_norm(x, residual, norm_weight, 1e-6)
        want = layer(normed)
    if num_tokens > 4:
        assert pair is None
        return
    assert pair is not None
    out, new_residual = pair
    assert torch.equal(new_residual, summed)
    assert _rel_err(out, want.double()) <= 2e-3
    assert not layer.gemv_locks.any()
