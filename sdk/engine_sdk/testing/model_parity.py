"""Logits parity of a model-architecture plugin with Hugging Face transformers.

A plugin author builds a tiny random checkpoint with ``build_tiny_model``, runs one
prefill through their ``ModelArchitecture`` on the CPU and compares the logits with
``transformers``' own implementation of the same architecture.
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path
from typing import Any

import torch

from engine_sdk.interfaces.attention import AttentionBackend, AttentionBatch
from engine_sdk.interfaces.model import ModelArchitecture, ModelContext
from engine_sdk.layers.decoder import head_dim_of
from engine_sdk.testing.models import build_tiny_model

__all__ = [
    "assert_logits_match_transformers",
    "load_float32_model",
    "model_prefill_logits",
    "prefill_logits",
]


def _single_prefill_batch(num_tokens: int, num_blocks: int) -> AttentionBatch:
    """One sequence of ``num_tokens`` new tokens in blocks ``0 .. num_blocks - 1``."""
    n = num_tokens
    return AttentionBatch(
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


def load_float32_model(
    model_cls: type[ModelArchitecture],
    config: Any,
    weights: Iterable[tuple[str, torch.Tensor]],
    backend_cls: type[AttentionBackend],
    block_size: int = 4,
    quant_config: Any = None,
) -> Any:
    """``model_cls`` in float32 on the CPU with ``weights`` loaded; every parameter must load."""
    ctx = ModelContext(
        hf_config=config,
        dtype=torch.float32,
        device=torch.device("cpu"),
        block_size=block_size,
        make_attention=backend_cls,
        quant_config=quant_config,
    )
    model = model_cls(ctx).eval()
    loaded = model.load_weights(weights)
    assert loaded == {name for name, _ in model.named_parameters()}
    return model


def model_prefill_logits(
    model: Any,
    prompt: list[int],
    backend_cls: type[AttentionBackend],
    kv_heads_and_head_dim: tuple[int, int],
    block_size: int = 4,
) -> torch.Tensor:
    """float32 logits [len(prompt), vocab] of one prefill of ``prompt`` (fresh caches)."""
    n = len(prompt)
    num_blocks = -(-n // block_size)
    shape = backend_cls.kv_cache_shape(num_blocks, block_size, *kv_heads_and_head_dim)
    caches = [torch.zeros(shape) for _ in range(model.num_attention_layers())]
    with torch.inference_mode():
        hidden = model(
            torch.tensor(prompt), torch.arange(n), caches, _single_prefill_batch(n, num_blocks)
        )
        logits: torch.Tensor = model.compute_logits(hidden)
        return logits


def prefill_logits(
    model_cls: type[ModelArchitecture],
    model_dir: Path,
    prompt: list[int],
    backend_cls: type[AttentionBackend],
    block_size: int = 4,
) -> torch.Tensor:
    """float32 logits [len(prompt), vocab] of one prefill; every parameter must load."""
    from safetensors.torch import load_file
    from transformers import AutoConfig

    config: Any = AutoConfig.from_pretrained(str(model_dir))
    weights = load_file(str(model_dir / "model.safetensors")).items()
    model = load_float32_model(model_cls, config, weights, backend_cls, block_size)
    kv_shape = (config.num_key_value_heads, head_dim_of(config))
    return model_prefill_logits(model, prompt, backend_cls, kv_shape, block_size)


def assert_logits_match_transformers(
    model_cls: type[ModelArchitecture],
    architecture: str,
    tmp_path: Path,
    backend_cls: type[AttentionBackend],
    **config_overrides: Any,
) -> None:
    """Build a tiny ``architecture`` checkpoint and compare prefill logits with transformers."""
    from transformers import AutoModelForCausalLM

    model_dir = build_tiny_model(tmp_path, architecture, **config_overrides)
    prompt = [5, 17, 42, 99, 3, 250, 7, 8, 9, 10, 11]
    ours = prefill_logits(model_cls, model_dir, prompt, backend_cls)
    hf: Any = AutoModelForCausalLM.from_pretrained(str(model_dir), dtype=torch.float32)
    hf.eval()
    with torch.no_grad():
        theirs = hf(torch.tensor([prompt])).logits[0]
    torch.testing.assert_close(ours, theirs, rtol=1e-4, atol=1e-5)
