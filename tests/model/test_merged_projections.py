"""q/k/v and gate/up merged into one GEMM each after loading: same outputs, no extra
memory; quantized layers merge only through their method's ``merge`` (FP8 does; a method
without one keeps separate GEMMs)."""

from __future__ import annotations

import torch
from engine_sdk.layers.linear import Linear, merge_linears


class _FakeQuant:
    pass


def _linear(n_in: int, n_out: int, bias: bool, seed: int) -> Linear:
    layer = Linear(n_in, n_out, bias)
    gen = torch.Generator().manual_seed(seed)
    layer.weight.data = torch.randn(n_out, n_in, generator=gen)
    if bias:
        layer.bias.data = torch.randn(n_out, generator=gen)  # type: ignore[union-attr]
    return layer


def test_merged_output_is_the_concatenation_and_shares_memory() -> None:
    for bias in (False, True):
        layers = [_linear(16, n, bias, i) for i, n in enumerate((32, 8, 8))]
        x = torch.randn(5, 16)
        expected = torch.cat([layer(x) for layer in layers], dim=-1)
        merged = merge_linears(layers)
        assert merged is not None and merged.output_size == 48
        torch.testing.assert_close(merged(x), expected)
        # The originals now view the merged storage, and still compute the same.
        ptr = merged.weight.untyped_storage().data_ptr()
        assert all(layer.weight.untyped_storage().data_ptr() == ptr for layer in layers)
        torch.testing.assert_close(torch.cat([lay(x) for lay in layers], -1), expected)


def test_refuses_quantized_or_mixed_layers() -> None:
    a, b = _linear(16, 8, False, 0), _linear(16, 8, True, 1)
    assert merge_linears([a, b]) is None  # bias on one only
    c = _linear(16, 8, False, 2)
    c.quant_method = _FakeQuant()  # type: ignore[assignment]
    assert merge_linears([a, c]) is None
    d = _linear(12, 8, False, 3)
    assert merge_linears([a, d]) is None  # different inputs


def test_engine_merges_plain_models_only(tmp_path: object) -> None:
    from pathlib import Path

    from engine import LLM
    from engine_sdk.testing.models import build_tiny_model

    path = build_tiny_model(Path(str(tmp_path)) / "m", "Qwen3ForCausalLM")
    base = {"device": "cpu", "dtype": "float32", "kv_cache_memory_bytes": 1 << 20}
    plain = LLM(str(path), **base).engine.runner.model
    layer = plain.model.layers[0]
    assert layer.self_attn.qkv_proj is not None and layer.mlp.gate_up_proj is not None
    weights = LLM(str(path), **base).engine.runner.weights_bytes
    params = sum(p.numel() * 4 for n, p in plain.named_parameters() if "qkv" not in n
                 and "gate_up" not in n)  # fmt: skip
    buffers = sum(b.numel() * b.element_size() for b in plain.buffers())
    assert weights == params + buffers  # merged weights are not counted twice
    fp8 = LLM(str(path), quantization="fp8", **base).engine.runner.model
    assert fp8.model.layers[0].self_attn.qkv_proj is not None  # Fp8LinearMethod.merge
    assert fp8.model.layers[0].mlp.gate_up_proj is not None
