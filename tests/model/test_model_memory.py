"""Memory planning: max_model_len, KV cache sizing and the three startup errors."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import pytest
import torch
from engine.errors import StartupError
from engine.model_executor.memory import (
    MemoryProfile,
    check_free_memory,
    plan_gpu_kv_cache,
    resolve_max_model_len,
)
from model_driver import make_runner

GiB = 1 << 30
# Tiny model, block size 4, float32: 2 (K,V) * 2 layers * 4 tokens * 2 kv heads * 16 * 4 B.
BYTES_PER_BLOCK = 2 * 2 * 4 * 2 * 16 * 4


def test_bytes_per_block_and_default_max_model_len(pm: Any, qwen3_dir: Path) -> None:
    runner = make_runner(pm, qwen3_dir, kv_cache_memory_bytes=1000 * BYTES_PER_BLOCK + 7)
    assert runner.bytes_per_block == BYTES_PER_BLOCK == 2048
    assert runner.num_blocks == 1000
    assert runner.max_model_len == 512
    assert len(runner.kv_caches) == 2
    assert tuple(runner.kv_caches[0].shape) == (2, 1000, 4, 2, 16)


def test_error_a_one_full_request_does_not_fit(pm: Any, qwen3_dir: Path) -> None:
    with pytest.raises(StartupError) as info:
        make_runner(pm, qwen3_dir, kv_cache_memory_bytes=100 * BYTES_PER_BLOCK)
    msg = str(info.value)
    assert "max_model_len=512" in msg
    assert "needs 128 blocks" in msg and "262144 bytes" in msg
    assert "has 100 blocks" in msg and "204800 bytes" in msg and "= 400 tokens" in msg
    assert "--max-model-len 400 or less" in msg
    assert "--kv-cache-memory-bytes" in msg and "--gpu-memory-utilization" in msg
    # ... and the suggested length does fit.
    runner = make_runner(
        pm, qwen3_dir, kv_cache_memory_bytes=100 * BYTES_PER_BLOCK, max_model_len=400
    )
    assert runner.num_blocks == 100


def test_error_b_no_room_for_one_block_cpu(pm: Any, qwen3_dir: Path) -> None:
    with pytest.raises(StartupError) as info:
        make_runner(pm, qwen3_dir, kv_cache_memory_bytes=1000)
    msg = str(info.value)
    assert "no memory is left for the KV cache" in msg
    assert "--kv-cache-memory-bytes is 1000" in msg and "(2048 bytes)" in msg


def test_error_b_weights_and_activations_exceed_the_budget() -> None:
    profile = MemoryProfile(
        total_bytes=80 * GiB,
        free_bytes_at_start=79 * GiB,
        weights_bytes=70 * GiB,
        peak_activation_bytes=3 * GiB,
        non_torch_bytes=GiB // 2,
    )
    with pytest.raises(StartupError) as info:
        plan_gpu_kv_cache(profile, 0.9, BYTES_PER_BLOCK, 4, 512)
    msg = str(info.value)
    assert "--gpu-memory-utilization 0.9 x 80.00 GiB allows 72.00 GiB" in msg
    assert "weights take 70.00 GiB" in msg and "peak activations 3.00 GiB" in msg
    assert "other memory 512.00 MiB" in msg and "leaving -1.50 GiB" in msg
    plan = plan_gpu_kv_cache(profile, 0.95, BYTES_PER_BLOCK, 4, 512)
    assert plan.kv_cache_bytes <= (0.95 * 80 - 73.5) * GiB < plan.kv_cache_bytes + 2048


def test_error_c_free_memory_below_the_requested_fraction() -> None:
    with pytest.raises(StartupError) as info:
        check_free_memory(total_bytes=80 * GiB, free_bytes=30 * GiB, utilization=0.92)
    msg = str(info.value)
    assert "free device memory is 30.00 GiB of 80.00 GiB" in msg
    assert "0.92 x 80.00 GiB = 73.60 GiB" in msg
    assert "--gpu-memory-utilization 0.37 or less" in msg
    check_free_memory(total_bytes=80 * GiB, free_bytes=30 * GiB, utilization=0.37)


def test_max_model_len_larger_than_the_model_supports(pm: Any, qwen3_dir: Path) -> None:
    with pytest.raises(StartupError) as info:
        make_runner(pm, qwen3_dir, max_model_len=1000)
    assert "--max-model-len 1000" in str(info.value) and "(512," in str(info.value)


def test_max_model_len_from_rope_scaling() -> None:
    class Cfg:
        max_position_embeddings = 4096
        rope_parameters = {
            "rope_type": "yarn",
            "factor": 4.0,
            "original_max_position_embeddings": 4096,
        }

    assert resolve_max_model_len(None, Cfg()) == 16384


def test_cpu_default_budget_is_capped_and_logged(
    pm: Any, qwen3_dir: Path, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.INFO):
        runner = make_runner(pm, qwen3_dir, kv_cache_memory_bytes=None, max_num_seqs=3)
    assert runner.num_blocks == 3 * 128
    text = caplog.text
    assert "KV cache: 384 blocks x 4 tokens = 1536 tokens" in text
    assert "maximum concurrency at max_model_len=512: 3.00x" in text
    assert "model weights take" in text


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_gpu_errors_b_and_c_and_a_plan(pm: Any, qwen3_dir: Path) -> None:
    with pytest.raises(StartupError, match="free device memory is"):
        make_runner(
            pm, qwen3_dir, device="cuda", kv_cache_memory_bytes=None, gpu_memory_utilization=1.0
        )
    with pytest.raises(StartupError, match="no memory is left for the KV cache"):
        make_runner(
            pm, qwen3_dir, device="cuda", kv_cache_memory_bytes=None, gpu_memory_utilization=0.0005
        )
    runner = make_runner(
        pm,
        qwen3_dir,
        device="cuda",
        kv_cache_memory_bytes=None,
        gpu_memory_utilization=0.05,
        max_num_batched_tokens=2048,
    )
    total = torch.cuda.mem_get_info()[1]
    assert 0 < runner.plan.kv_cache_bytes < 0.05 * total
    assert runner.kv_caches[0].device.type == "cuda"
