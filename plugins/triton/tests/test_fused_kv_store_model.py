"""A tiny Qwen3 on the Triton backend (Triton's interpreter on CPU): with the fused q/k/v
epilogue on, K and V reach the paged cache from that kernel (``kv_store_target`` /
``forward_stored``: no store launch), and a prefill and the decode step after it give the
logits and the cache of the backend's own store path."""

from __future__ import annotations

import pytest
import torch
from engine_sdk.interfaces.attention import AttentionBatch
from engine_sdk.layers import attention, fused_ops

BLOCK_SIZE = 4


def _batch(ctx_len: int, num_new: int, blocks: int) -> AttentionBatch:
    seq_len = ctx_len + num_new
    return AttentionBatch(
        query_start_loc=torch.tensor([0, num_new], dtype=torch.int32),
        seq_lens=torch.tensor([seq_len], dtype=torch.int32),
        block_tables=torch.arange(blocks, dtype=torch.int32)[None],
        slot_mapping=torch.arange(ctx_len, seq_len),
        max_query_len=num_new,
        max_seq_len=seq_len,
        num_seqs=1,
        num_tokens=num_new,
        query_start_loc_cpu=[0, num_new],
        seq_lens_cpu=[seq_len],
    )


def _run(model, prompt: list[int], next_token: int) -> tuple[torch.Tensor, list[torch.Tensor]]:
    """Logits of a prefill of ``prompt`` then one decode step, and the caches after."""
    blocks = -(-(len(prompt) + 1) // BLOCK_SIZE)
    attn = model.model.layers[0].self_attn
    backend = attn.attn.backend
    shape = backend.kv_cache_shape(blocks, BLOCK_SIZE, attn.num_kv_heads, attn.head_dim)
    caches = [torch.zeros(shape) for _ in model.model.layers]
    logits = []
    with torch.inference_mode():
        steps = ((prompt, 0), ([next_token], len(prompt)))
        for tokens, ctx_len in steps:
            meta = backend.build_metadata(_batch(ctx_len, len(tokens), blocks))
            positions = torch.arange(ctx_len, ctx_len + len(tokens))
            hidden = model(torch.tensor(tokens), positions, caches, meta)
            logits.append(model.compute_logits(hidden)[-1])
    return torch.stack(logits), caches


@pytest.mark.skipif(
    torch.cuda.is_available(),
    reason="CPU tensors through Triton's interpreter; on a GPU the decode-graph and engine "
    "parity tests run the fused store",
)
def test_decoder_writes_kv_from_its_fused_kernel(tmp_path, monkeypatch):
    from engine_sdk.testing import model_parity
    from engine_sdk.testing.models import build_tiny_model
    from engine_sdk.testing.quantized_model import MODEL_CLASSES
    from engine_triton import backend as triton_backend
    from safetensors.torch import load_file
    from transformers import AutoConfig

    monkeypatch.setenv("ENGINE_FUSED_OPS", "force")
    fused_ops._kernels.cache_clear()
    model_dir = build_tiny_model(tmp_path, "Qwen3ForCausalLM")
    config = AutoConfig.from_pretrained(str(model_dir))
    weights = load_file(str(model_dir / "model.safetensors")).items()
    model = model_parity.load_float32_model(
        MODEL_CLASSES["Qwen3ForCausalLM"], config, weights,
        triton_backend.TritonAttentionBackend, block_size=BLOCK_SIZE,
    )  # fmt: skip
    for layer in model.model.layers:
        layer.self_attn.merge_projections()

    stores = []
    store_kernel = triton_backend.store_kv_kernel

    class CountingStore:
        def __getitem__(self, grid):
            stores.append(grid)
            return store_kernel[grid]

    monkeypatch.setattr(triton_backend, "store_kv_kernel", CountingStore())
    prompt = [5, 17, 3, 99, 42, 7]
    monkeypatch.setattr(attention, "_FUSED_KV_STORE", False)
    want_logits, want_caches = _run(model, prompt, 11)
    layers = len(model.model.layers)
    assert len(stores) == 2 * layers  # the backend stored K/V: two steps x every layer
    stores.clear()
    monkeypatch.setattr(attention, "_FUSED_KV_STORE", True)
    got_logits, got_caches = _run(model, prompt, 11)
    fused_ops._kernels.cache_clear()
    assert not stores  # the fused kernel wrote them: no store launch
    for got, want in zip(got_caches, want_caches, strict=True):
        assert torch.equal(got, want)
        assert got.abs().sum() > 0
    torch.testing.assert_close(got_logits, want_logits, atol=1e-5, rtol=1e-5)
    assert not torch.equal(want_logits[0], want_logits[1])  # two different steps


@pytest.fixture(autouse=True)
def _clear_kernel_cache():
    yield
    fused_ops._kernels.cache_clear()
