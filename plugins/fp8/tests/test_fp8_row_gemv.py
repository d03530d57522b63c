"""fp8 decode rows through the SDK's row GEMV (``engine_sdk.layers.gemv`` reading the e4m3
weight with its scale): the plain projection, the add+RMSNorm launch and the gated SiLU
launch of a merged gate/up, for the tensor and channel layouts (block scales keep the
plugin's split-K GEMV), and a tiny fp8 Qwen3 whose one-token forward takes those launches
(Triton's interpreter on a CPU with ``ENGINE_GEMV=force``, the compiled kernels on a GPU).
"""

from __future__ import annotations

from pathlib import Path

import engine_fp8.method as fp8_method
import pytest
import torch
from engine_sdk.layers import gemv
from engine_sdk.layers.linear import Linear, merge_linears
from test_fp8_merge import BY_ID, _layers, _x

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
ROW_LAYOUTS = [
    "online_tensor",
    "online_channel_token",
    "fp8_tensor_static",
    "ct_channel_weight_only",
]


@pytest.fixture(autouse=True)
def _force_gemv(monkeypatch: pytest.MonkeyPatch) -> None:
    if DEVICE == "cpu":
        monkeypatch.setenv("ENGINE_GEMV", "force")


def _count(monkeypatch: pytest.MonkeyPatch, name: str) -> list[dict]:
    """Record the keyword arguments of every call of ``gemv.<name>``."""
    calls: list[dict] = []
    real = getattr(gemv, name)

    def spy(*args, **kwargs):  # type: ignore[no-untyped-def]
        calls.append(kwargs)
        return real(*args, **kwargs)

    monkeypatch.setattr(gemv, name, spy)
    return calls


def _dequantized(layer: Linear) -> torch.Tensor:
    return layer.quant_method.dequantize_weight(layer, torch.float32).cpu()  # type: ignore[attr-defined]


def _close(got: torch.Tensor, want: torch.Tensor) -> None:
    """bf16 output of a float32 sum: a few ulps of the largest magnitude."""
    err = (got.float().cpu() - want).abs().max().item()
    assert err <= 2e-2 * want.abs().max().item() + 1e-3, err


@pytest.mark.parametrize("layout_id", ROW_LAYOUTS)
def test_one_row_takes_the_row_gemv(monkeypatch: pytest.MonkeyPatch, layout_id: str) -> None:
    """Separate layers (a tensor or channel scale) and the merged one (channel scales)
    compute x @ dequantized.T + bias through ``gemv.gemv`` with the fp8 weight."""
    layers = _layers(BY_ID[layout_id], bias=True, dtype=torch.bfloat16)
    merged = merge_linears(layers)
    assert merged is not None
    calls = _count(monkeypatch, "gemv")
    x = _x(1, torch.bfloat16)
    for layer in (layers[1], merged):
        with torch.inference_mode():
            got = layer(x)
        bias = layer.bias.float().cpu()  # type: ignore[union-attr]
        _close(got, x.float().cpu() @ _dequantized(layer).T + bias)
    assert len(calls) == 2 and all(kw["scale"] is not None for kw in calls)


def test_block_scales_and_the_switch_keep_the_plugin_kernels(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Block-scaled weights never reach the row GEMV (their scales are tiles), and
    ``ENGINE_FP8_ROW_GEMV=0`` (the module's ``ROW_GEMV``) leaves every layout to the
    plugin's own paths; the fused norm calls then decline (None) on a CPU."""
    calls = _count(monkeypatch, "gemv")
    x = _x(1, torch.bfloat16)
    block = _layers(BY_ID["fp8_block"], dtype=torch.bfloat16)[0]
    with torch.inference_mode():
        block(x)
    assert calls == []
    monkeypatch.setattr(fp8_method, "ROW_GEMV", False)
    layer = _layers(BY_ID["online_channel_token"], dtype=torch.bfloat16)[0]
    with torch.inference_mode():
        layer(x)
        norm_w = torch.ones(x.shape[1], dtype=x.dtype, device=DEVICE)
        fused = layer.quant_method.apply_add_rms_norm_silu(layer, x, x, norm_w, 1e-6)
    assert calls == []
    if DEVICE == "cpu":
        assert fused is None


@pytest.mark.parametrize("layout_id", ["online_tensor", "ct_channel_weight_only"])
def test_norm_and_gated_launches_over_a_merged_gate_up(
    monkeypatch: pytest.MonkeyPatch, layout_id: str
) -> None:
    """A merged [gate | up] of two layers with different scales: the add+RMSNorm launch
    gives the dequantized projection of the normalized row, the gated launch silu(gate) *
    up of it (a swapped or missing up-row scale shows: the layers' gains differ 4x)."""
    from engine_sdk.layers import fused_ops

    layers = _layers(BY_ID[layout_id], ((40, 1.0), (40, 4.0)), dtype=torch.bfloat16)
    merged = merge_linears(layers)
    assert merged is not None
    calls = _count(monkeypatch, "gemv_add_rms_norm")
    gen = torch.Generator().manual_seed(4)
    x = (torch.randn(1, 128, generator=gen) * 2).to(DEVICE, torch.bfloat16)
    residual = torch.randn(1, 128, generator=gen).to(DEVICE, torch.bfloat16)
    norm_w = (1 + 0.1 * torch.randn(128, generator=gen)).to(DEVICE, torch.bfloat16)
    normed, want_res = fused_ops.add_rms_norm(x, residual, norm_w, 1e-6)
    proj = normed.float().cpu() @ _dequantized(merged).T
    method = merged.quant_method
    with torch.inference_mode():
        plain = method.apply_add_rms_norm(merged, x, residual, norm_w, 1e-6)
        gated = method.apply_add_rms_norm_silu(merged, x, residual, norm_w, 1e-6)
    assert plain is not None and gated is not None
    _close(plain[0], proj)
    gate, up = proj.to(torch.bfloat16).float().chunk(2, dim=-1)
    _close(gated[0], gate * torch.sigmoid(gate) * up)
    assert torch.equal(plain[1], want_res) and torch.equal(gated[1], want_res)
    assert [kw.get("gated", False) for kw in calls] == [False, True]
    assert all(kw["scale"] is not None for kw in calls)


@pytest.mark.skipif(DEVICE == "cuda", reason="the SDK's dense test attention runs on the CPU")
def test_tiny_fp8_qwen3_decode_row_takes_the_fused_launches(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """One token through a tiny Qwen3 quantized online to fp8 (merged projections):
    q/k/v after the first layer and every gate/up take the fused row launches (gate/up
    the gated one), o and down the plain one; the logits match the plugin's own paths
    (``ENGINE_FP8_ROW_GEMV=0``: the dequantizing reference on a CPU)."""
    from engine_fp8.config import Fp8Config
    from engine_sdk.layers import decoder
    from engine_sdk.testing import model_parity
    from engine_sdk.testing.dense_attention import DenseAttentionBackend
    from engine_sdk.testing.models import build_tiny_model
    from engine_sdk.testing.quantized_model import MODEL_CLASSES
    from safetensors.torch import load_file
    from transformers import AutoConfig

    model_dir = build_tiny_model(tmp_path, "Qwen3ForCausalLM")
    config = AutoConfig.from_pretrained(str(model_dir))
    weights = load_file(str(model_dir / "model.safetensors")).items()
    model = model_parity.load_float32_model(
        MODEL_CLASSES["Qwen3ForCausalLM"], config, weights, DenseAttentionBackend,
        quant_config=Fp8Config.from_config({}),
    )  # fmt: skip
    model = model.to(torch.bfloat16)  # online fp8: quantized from the bf16 weights below
    for module in model.modules():
        if isinstance(module, Linear):
            module.quant_method.process_weights_after_loading(module)
    for layer in model.model.layers:
        layer.self_attn.merge_projections()
        layer.mlp.merge_projections()
    assert model.model.layers[0].mlp.gate_up_proj.weight.dtype == torch.float8_e4m3fn
    attn = model.model.layers[0].self_attn
    kv = (attn.num_kv_heads, attn.head_dim)

    def logits() -> torch.Tensor:
        with torch.inference_mode():
            return model_parity.model_prefill_logits(
                model, [42], DenseAttentionBackend, kv
            ).float()  # fmt: skip

    for switch in ("ENGINE_FUSED_NORM", "ENGINE_FUSED_SILU"):  # on, whatever ran before
        monkeypatch.delenv(switch, raising=False)
    decoder._fused_norm_enabled.cache_clear()
    decoder._fused_silu_enabled.cache_clear()
    plain, fused = _count(monkeypatch, "gemv"), _count(monkeypatch, "gemv_add_rms_norm")
    got = logits()
    num_layers = len(model.model.layers)
    assert [kw.get("gated", False) for kw in fused].count(True) == num_layers
    assert len(fused) == 2 * num_layers - 1  # the first layer's norm has no residual yet
    assert len(plain) == 2 * num_layers + 1  # o, down; the first q/k/v
    assert all(kw["scale"] is not None for kw in plain + fused)
    monkeypatch.setattr(fp8_method, "ROW_GEMV", False)
    torch.testing.assert_close(got, logits(), atol=0.05, rtol=0.05)
