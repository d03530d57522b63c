"""Startup checks of ``--tensor-parallel-size`` (no worker starts) and the head/shard plan
of the parallel layers: which sizes fit, how heads map to ranks, and that the weights a
rank loads are exactly its slices of the checkpoint."""

from __future__ import annotations

import multiprocessing
from pathlib import Path

import pytest
import torch
from engine import LLM
from engine.config import EngineArgs
from engine.errors import StartupError
from engine.executor import validation
from engine_sdk.layers.parallel import (
    TensorParallelGroup,
    current_tensor_parallel,
    shard_attention_heads,
    tensor_parallel,
    valid_tensor_parallel_sizes,
)
from tp_helpers import BASE


def test_valid_sizes_split_heads_kv_heads_and_mlp() -> None:
    assert valid_tensor_parallel_sizes(4, 2, 128) == [1, 2, 4]
    assert valid_tensor_parallel_sizes(16, 8, 3072) == [1, 2, 4, 8, 16]  # Qwen3-0.6B
    assert valid_tensor_parallel_sizes(12, 4, 96) == [1, 2, 4, 12]  # 3, 6: KV heads don't split
    assert valid_tensor_parallel_sizes(8, 8, 100) == [1, 2, 4]  # 8 does not split the MLP


@pytest.mark.parametrize(
    ("num_heads", "num_kv_heads", "size", "expected"),
    [
        # (heads, kv heads, kv shard index, kv shards) of ranks 0..size-1
        (4, 2, 2, [(2, 1, 0, 2), (2, 1, 1, 2)]),
        (4, 1, 2, [(2, 1, 0, 1), (2, 1, 0, 1)]),  # replicated
        (8, 2, 4, [(2, 1, 0, 2), (2, 1, 0, 2), (2, 1, 1, 2), (2, 1, 1, 2)]),
        (8, 4, 2, [(4, 2, 0, 2), (4, 2, 1, 2)]),
    ],
)
def test_head_shards(
    num_heads: int, num_kv_heads: int, size: int, expected: list[tuple[int, ...]]
) -> None:
    got = []
    for rank in range(size):
        s = shard_attention_heads(num_heads, num_kv_heads, TensorParallelGroup(rank, size))
        got.append((s.num_heads, s.num_kv_heads, s.kv_shard_index, s.num_kv_shards))
        # the rank's query heads all use the KV head(s) it holds (GQA groups stay whole)
        group = num_heads // num_kv_heads
        first_q = rank * s.num_heads
        kv_heads_used = {q // group for q in range(first_q, first_q + s.num_heads)}
        first_kv = s.kv_shard_index * s.num_kv_heads
        assert kv_heads_used == set(range(first_kv, first_kv + s.num_kv_heads))
    assert got == expected
    with pytest.raises(ValueError, match="valid sizes: 1, 2, 4"):
        shard_attention_heads(4, 2, TensorParallelGroup(0, 3))


def test_invalid_size_is_a_startup_error_naming_valid_sizes(qwen3_dir: Path) -> None:
    with pytest.raises(StartupError, match=r"tensor-parallel-size 3 .*valid sizes: 1, 2, 4"):
        LLM(model=str(qwen3_dir), tensor_parallel_size=3, **BASE)
    with pytest.raises(StartupError, match="positive integer"):
        LLM(model=str(qwen3_dir), tensor_parallel_size=0, **BASE)


def test_quantization_and_pinned_gpu_are_refused(
    qwen3_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    with pytest.raises(StartupError, match="quantized"):
        LLM(model=str(qwen3_dir), tensor_parallel_size=2, quantization="fp8", **BASE)
    with pytest.raises(StartupError, match="CUDA_VISIBLE_DEVICES"):
        validation._check_devices(2, "cuda:0")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    with pytest.raises(StartupError, match="needs 2 GPUs but 1 are visible"):
        validation._check_devices(2, "auto")


def test_engine_built_while_spawning_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(multiprocessing.current_process(), "_inheriting", True, raising=False)
    with pytest.raises(StartupError, match='if __name__ == "__main__":'):
        validation.check_main_guard()


def _fake_group(rank: int) -> TensorParallelGroup:
    return TensorParallelGroup(rank, 2)


@pytest.mark.parametrize("num_kv_heads", [2, 1])
def test_each_rank_loads_only_its_slices(tmp_path: Path, num_kv_heads: int) -> None:
    """Build both ranks' models (no collectives run) and load the checkpoint: every
    sharded tensor is the rank's slice; the ranks' slices make up the checkpoint."""
    from engine.model_executor.source import HFFolderSource
    from engine_qwen3.model import Qwen3ForCausalLM
    from engine_sdk.interfaces.model import ModelContext
    from engine_sdk.testing.models import build_tiny_model
    from safetensors.torch import load_file

    path = build_tiny_model(
        tmp_path, "Qwen3ForCausalLM", num_key_value_heads=num_kv_heads, vocab_size=397
    )
    source = HFFolderSource(path, EngineArgs(model=str(path)))
    full = load_file(str(path / "model.safetensors"))
    ranks: list[dict[str, torch.Tensor]] = []
    for rank in range(2):
        ctx = ModelContext(
            hf_config=source.hf_config,
            dtype=torch.float32,
            device=torch.device("cpu"),
            block_size=4,
            make_attention=lambda config: _NoAttention(),
        )
        with tensor_parallel(_fake_group(rank)):
            model = Qwen3ForCausalLM(ctx)
        assert current_tensor_parallel() is None
        loaded = model.load_weights(source.iter_weights(torch.float32))
        assert loaded == {n for n, _ in model.named_parameters()}
        ranks.append(dict(model.state_dict()))
    attn = "model.layers.0.self_attn"
    for rank, state in enumerate(ranks):
        q = full[f"{attn}.q_proj.weight"]
        assert torch.equal(state[f"{attn}.q_proj.weight"], q.chunk(2)[rank])
        kv_rank = rank if num_kv_heads == 2 else 0
        k = full[f"{attn}.k_proj.weight"]
        assert torch.equal(state[f"{attn}.k_proj.weight"], k.chunk(num_kv_heads)[kv_rank])
        o = full[f"{attn}.o_proj.weight"]
        assert torch.equal(state[f"{attn}.o_proj.weight"], o.chunk(2, dim=1)[rank])
        down = full["model.layers.1.mlp.down_proj.weight"]
        assert torch.equal(state["model.layers.1.mlp.down_proj.weight"], down.chunk(2, dim=1)[rank])
        norm = full["model.layers.0.self_attn.q_norm.weight"]
        assert torch.equal(state["model.layers.0.self_attn.q_norm.weight"], norm)
    # vocabulary 397 = 199 + 198 rows; rank 1's last row is padding (zeros)
    embed = full["model.embed_tokens.weight"]
    shards = [s["model.embed_tokens.weight"] for s in ranks]
    assert [tuple(s.shape) for s in shards] == [(199, 64), (199, 64)]
    assert torch.equal(torch.cat([shards[0], shards[1][:198]]), embed)
    assert torch.count_nonzero(shards[1][198]) == 0


class _NoAttention:
    pass
