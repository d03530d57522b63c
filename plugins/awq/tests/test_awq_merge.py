"""Merging AWQ projections (q/k/v, gate/up) into one layer: the checkpoint layout (torch
dequantize path) and the tiled layout (W4A16 kernels; Triton's interpreter on a CPU)
compute the concatenation of the separate layers, and the originals keep working on views
of the merged tensors."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from awq_formats import awq_gemm
from engine_awq.config import AwqConfig
from engine_awq.method import AwqLinearMethod
from engine_sdk.layers.linear import Linear, merge_linears
from engine_sdk.testing.models import build_tiny_model
from engine_sdk.testing.quantization import quantized_linears
from engine_sdk.testing.quantized_model import build_model, greedy, quantized_state

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
CONFIG = {"quant_method": "awq", "bits": 4, "zero_point": True, "version": "gemm"}
# Different magnitudes per layer, so a column shifted into the wrong layer's scales shows.
SIZES_AND_GAINS = ((64, 1.0), (32, 4.0), (48, 0.25))


def _layers(
    group_size: int = 32,
    sizes_and_gains: tuple[tuple[int, float], ...] = SIZES_AND_GAINS,
    bias: bool = False,
    dtype: torch.dtype = torch.float16,
) -> list[Linear]:
    cfg = AwqConfig.from_config({**CONFIG, "group_size": group_size})
    return quantized_linears(
        cfg, lambda w: awq_gemm(w, group_size), sizes_and_gains, bias=bias, dtype=dtype,
        device=DEVICE,
    )  # fmt: skip


def _x(num_tokens: int, dtype: torch.dtype) -> torch.Tensor:
    return torch.randn(num_tokens, 128, generator=torch.Generator().manual_seed(1)).to(
        DEVICE, dtype
    )


def _separate(layers: list[Linear], x: torch.Tensor) -> torch.Tensor:
    with torch.inference_mode():
        return torch.cat([layer(x) for layer in layers], dim=-1)


def _tile(layers: list[Linear]) -> None:
    for layer in layers:
        if layer.awq_chunk is None:
            assert layer.quant_method.repack(layer)


@pytest.mark.parametrize("bias", [False, True])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16], ids=str)
def test_merged_equals_concatenation_checkpoint_layout(dtype: torch.dtype, bias: bool) -> None:
    if DEVICE != "cpu":
        pytest.skip("CUDA layers load into the tiled layout")
    layers = _layers(bias=bias, dtype=dtype)
    x = _x(5, dtype)
    expected = _separate(layers, x)
    merged = merge_linears(layers)
    assert merged is not None and isinstance(merged.quant_method, AwqLinearMethod)
    assert merged.awq_chunk is None
    assert (merged.qweight.shape, merged.qzeros.shape, merged.scales.shape) == (
        (128, 18),
        (4, 18),
        (4, 144),
    )
    with torch.inference_mode():
        got = merged(x)
        after = _separate(layers, x)
    torch.testing.assert_close(
        got, expected, rtol=1e-5 if dtype == torch.float32 else 2e-3, atol=1e-5
    )
    assert torch.equal(after, expected)  # the originals, now on views, compute the same
    for name in ("qweight", "qzeros", "scales"):
        ptr = getattr(merged, name).untyped_storage().data_ptr()
        assert all(getattr(layer, name).untyped_storage().data_ptr() == ptr for layer in layers)


@pytest.mark.parametrize("num_tokens", [1, 8, 19, 300])  # fma, dot, dot, dequantize
def test_merged_equals_concatenation_tiled(num_tokens: int) -> None:
    layers = _layers(group_size=64, bias=True)
    _tile(layers)
    x = _x(num_tokens, torch.float16)
    expected = _separate(layers, x).float()
    merged = merge_linears(layers)
    assert merged is not None and merged.awq_chunk == 128
    assert (merged.tiled_qweight.shape, merged.tiled_zeros.shape, merged.scales.shape) == (
        (144, 16),
        (2, 144),
        (2, 144),
    )
    with torch.inference_mode():
        got = merged(x).float()
        after = _separate(layers, x).float()  # the kernels on views of the merged tensors
    bound = 2e-3 * expected.abs().max().item()  # fp16 output rounding, split-K order
    assert (got - expected).abs().max().item() <= bound
    assert (after - expected).abs().max().item() <= bound
    assert not layers[1].scales.is_contiguous()  # the views really are strided
    for name in ("tiled_qweight", "tiled_zeros", "scales"):
        ptr = getattr(merged, name).untyped_storage().data_ptr()
        assert all(getattr(layer, name).untyped_storage().data_ptr() == ptr for layer in layers)


def test_refusals_leave_the_layers_alone() -> None:
    g32, g64 = _layers(group_size=32), _layers(group_size=64)
    name = "qweight" if g32[0].awq_chunk is None else "tiled_qweight"
    qweights = [getattr(layer, name) for layer in g32]
    assert merge_linears([g32[0], g64[1]]) is None  # group sizes differ
    plain = Linear(128, 32, False, None, "plain", torch.float16).to(DEVICE)
    assert merge_linears([g32[0], plain]) is None  # AWQ and unquantized
    if g32[1].awq_chunk is None:
        g32[1].quant_method.repack(g32[1])
        assert merge_linears(g32) is None  # different layouts
        assert all(layer.qweight is q for layer, q in zip(g32[::2], qweights[::2], strict=True))
    else:
        assert all(layer.tiled_qweight is q for layer, q in zip(g32, qweights, strict=True))


@pytest.mark.parametrize("arch", ["Qwen3ForCausalLM", "LlamaForCausalLM"])
def test_tiny_model_gives_the_same_tokens_merged(arch: str, tmp_path: Path) -> None:
    if DEVICE != "cpu":
        pytest.skip("builds the model on the CPU")
    model_dir = build_tiny_model(tmp_path / "m", arch, seed=3)
    state = quantized_state(model_dir, lambda w: awq_gemm(w, 32))
    cfg = {**CONFIG, "group_size": 32}
    separate, merged = (build_model(model_dir, AwqConfig.from_config(cfg), state) for _ in "ab")
    merged.merge_projections()
    for layer in merged.model.layers:
        assert layer.self_attn.qkv_proj is not None and layer.mlp.gate_up_proj is not None
    prompt = [5, 17, 42, 99, 3, 250, 7, 8]
    tokens, logits = greedy(separate, prompt, 8)
    merged_tokens, merged_logits = greedy(merged, prompt, 8)
    assert merged_tokens == tokens
    torch.testing.assert_close(merged_logits, logits, rtol=1e-4, atol=1e-4)


def reference_and_tiled_models(tmp_path: Path, seed: int) -> tuple:
    """A tiny fp16 AWQ Qwen3 (group 32) twice: on the checkpoint layout (torch dequantize
    path) and on the tiled layout with merged projections (the Triton kernels)."""
    model_dir = build_tiny_model(tmp_path / "m", "Qwen3ForCausalLM", seed=seed)
    state = quantized_state(model_dir, lambda w: awq_gemm(w, 32))
    cfg = AwqConfig.from_config({**CONFIG, "group_size": 32})
    reference, tiled = (build_model(model_dir, cfg, state).half() for _ in "ab")
    for module in tiled.modules():
        if isinstance(getattr(module, "quant_method", None), AwqLinearMethod):
            assert module.quant_method.repack(module)
    tiled.merge_projections()
    return reference, tiled


def test_tiny_model_tiled_kernels_match_the_reference_layout(tmp_path: Path) -> None:
    """A whole fp16 model on the tiled layout (W4A16 kernels, merged projections) against
    the same weights on the checkpoint layout (torch dequantize path). Hidden size 64 gives
    64-row chunks (CUDA cores for 3-4 tokens, the dequantize pass for 8-9) and the MLP's
    128 a 128-row chunk for down_proj (CUDA cores, then tensor cores)."""
    if DEVICE != "cpu":
        pytest.skip("builds the model on the CPU")
    reference, tiled = reference_and_tiled_models(tmp_path, seed=4)
    mlp = tiled.model.layers[0].mlp
    assert (mlp.gate_up_proj.awq_chunk, mlp.down_proj.awq_chunk) == (64, 128)
    for prompt in ([5, 17, 42], [5, 17, 42, 99, 3, 250, 7, 8]):
        tokens, logits = greedy(reference, prompt, 2)
        tiled_tokens, tiled_logits = greedy(tiled, prompt, 2)
        assert tiled_tokens == tokens
        torch.testing.assert_close(tiled_logits.float(), logits.float(), rtol=2e-2, atol=2e-2)


def test_tiny_model_fuses_the_norm_into_decode_gemvs(tmp_path: Path, monkeypatch) -> None:
    """With at most four rows the decoder hands the residual add and RMSNorm to the AWQ
    GEMV (``AwqLinearMethod.apply_add_rms_norm``); the tokens and logits equal those of the
    same tiled model with that fusion refused (the decoder's own norm kernels)."""
    if DEVICE != "cpu":
        pytest.skip("builds the model on the CPU")
    from engine_awq import gemv
    from engine_sdk.layers import decoder

    model_dir = build_tiny_model(tmp_path / "m", "Qwen3ForCausalLM", seed=5)
    state = quantized_state(model_dir, lambda w: awq_gemm(w, 32))
    cfg = AwqConfig.from_config({**CONFIG, "group_size": 32})
    model = build_model(model_dir, cfg, state).half()
    for module in model.modules():
        if isinstance(getattr(module, "quant_method", None), AwqLinearMethod):
            assert module.quant_method.repack(module)
    model.merge_projections()
    calls = []
    real = gemv.awq_gemv_add_rms_norm

    def spy(*args, **kwargs):  # type: ignore[no-untyped-def]
        calls.append(args[0].shape[0])
        return real(*args, **kwargs)

    monkeypatch.setattr(gemv, "awq_gemv_add_rms_norm", spy)
    prompt = [5, 17, 42]
    tokens, logits = greedy(model, prompt, 2)
    layers = len(model.model.layers)
    # per step: q/k/v of every layer but the first (its input has no residual yet), and
    # gate/up of every layer; 3 rows, then 4
    assert calls == [3] * (2 * layers - 1) + [4] * (2 * layers - 1)
    fusing = AwqLinearMethod.apply_add_rms_norm
    monkeypatch.setattr(AwqLinearMethod, "apply_add_rms_norm", lambda *a, **k: None)
    calls.clear()
    plain_tokens, plain_logits = greedy(model, prompt, 2)
    assert calls == []
    assert tokens == plain_tokens
    torch.testing.assert_close(logits.float(), plain_logits.float(), rtol=1e-2, atol=1e-2)
    # ENGINE_FUSED_NORM=0 (for timing the fusion): the decoder does not ask the method
    monkeypatch.setattr(AwqLinearMethod, "apply_add_rms_norm", fusing)
    monkeypatch.setenv("ENGINE_FUSED_NORM", "0")
    decoder._fused_norm_enabled.cache_clear()
    try:
        off_tokens, _ = greedy(model, prompt, 2)
    finally:
        monkeypatch.delenv("ENGINE_FUSED_NORM")
        decoder._fused_norm_enabled.cache_clear()
    assert calls == [] and off_tokens == tokens
