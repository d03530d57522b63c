"""Qwen3ForCausalLM: plugin conformance and logits parity with transformers (SDK layers only)."""

from __future__ import annotations

from pathlib import Path

import engine_qwen3.plugin
import pytest
import torch
from engine_qwen3.model import Qwen3ForCausalLM
from engine_reference.backend import ReferenceAttentionBackend
from engine_sdk.interfaces.attention import AttentionBatch
from engine_sdk.interfaces.model import ModelContext
from engine_sdk.testing import PluginConformance
from engine_sdk.testing.models import build_tiny_model
from safetensors.torch import load_file


class TestConformance(PluginConformance):
    plugin = engine_qwen3.plugin


def _prefill_logits(model_dir: Path, prompt: list[int], block_size: int = 4) -> torch.Tensor:
    from transformers import AutoConfig

    ctx = ModelContext(
        hf_config=AutoConfig.from_pretrained(str(model_dir)),
        dtype=torch.float32,
        device=torch.device("cpu"),
        block_size=block_size,
        make_attention=ReferenceAttentionBackend,
    )
    model = Qwen3ForCausalLM(ctx).eval()
    loaded = model.load_weights(load_file(str(model_dir / "model.safetensors")).items())
    assert loaded == {name for name, _ in model.named_parameters()}
    n = len(prompt)
    num_blocks = -(-n // block_size)
    caches = [
        torch.zeros(ReferenceAttentionBackend.kv_cache_shape(num_blocks, block_size, 2, 16))
        for _ in range(model.num_attention_layers())
    ]
    batch = AttentionBatch(
        query_start_loc=torch.tensor([0, n], dtype=torch.int32),
        seq_lens=torch.tensor([n], dtype=torch.int32),
        block_tables=torch.arange(num_blocks, dtype=torch.int32)[None],
        slot_mapping=torch.arange(n),
        max_query_len=n,
        max_seq_len=n,
        num_seqs=1,
        num_tokens=n,
        query_start_loc_cpu=[0, n],
        seq_lens_cpu=[n],
    )
    with torch.inference_mode():
        hidden = model(torch.tensor(prompt), torch.arange(n), caches, batch)
        return model.compute_logits(hidden)


@pytest.mark.parametrize("tie", [False, True])
def test_logits_match_transformers(tmp_path: Path, tie: bool) -> None:
    from transformers import AutoModelForCausalLM

    model_dir = build_tiny_model(tmp_path, "Qwen3ForCausalLM", tie_word_embeddings=tie)
    prompt = [5, 17, 42, 99, 3, 250, 7, 8, 9, 10, 11]
    ours = _prefill_logits(model_dir, prompt)
    hf = AutoModelForCausalLM.from_pretrained(str(model_dir), dtype=torch.float32).eval()
    with torch.no_grad():
        theirs = hf(torch.tensor([prompt])).logits[0]
    torch.testing.assert_close(ours, theirs, rtol=1e-4, atol=1e-5)
