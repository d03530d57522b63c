"""Memory planning: context length, KV cache budget and the checks that fail startup early.

GPU: the engine may use ``gpu_memory_utilization`` x total device memory. What is left
after the weights, the peak activations of a profiling forward of
``max_num_batched_tokens`` tokens and non-torch memory (CUDA context, ...) becomes KV
cache, unless ``--kv-cache-memory-bytes`` sets the cache size directly. CPU: the cache
size is ``--kv-cache-memory-bytes``, by default min(1 GiB, 25% of RAM), capped at what
``max_num_seqs`` full-length requests can use.

The three startup errors, each naming its numbers and the flags to change:
  (a) one request of ``max_model_len`` tokens does not fit in the cache,
  (b) no memory is left for even one cache block,
  (c) free device memory at startup is below what ``gpu_memory_utilization`` asks for.

A block holds ``block_size`` tokens of K and V for every layer; its size comes from the
backend's cache shape (default 2 * num_layers * block_size * num_kv_heads * head_dim *
dtype size).
"""

from __future__ import annotations

import logging
import math
import os
from dataclasses import dataclass
from typing import Any

from engine.errors import StartupError

logger = logging.getLogger(__name__)

__all__ = [
    "MemoryPlan",
    "MemoryProfile",
    "check_free_memory",
    "default_cpu_kv_cache_bytes",
    "format_bytes",
    "model_max_len",
    "plan_cpu_kv_cache",
    "plan_gpu_kv_cache",
    "resolve_max_model_len",
]

GiB = 1 << 30
_CPU_DEFAULT_CAP = 1 * GiB


def format_bytes(num_bytes: float) -> str:
    """``1536`` -> ``"1.50 KiB"``; negative values keep their sign."""
    sign, value = ("-" if num_bytes < 0 else ""), abs(float(num_bytes))
    for unit in ("B", "KiB", "MiB", "GiB"):
        if value < 1024 or unit == "GiB":
            return f"{sign}{value:.2f} {unit}" if unit != "B" else f"{sign}{int(value)} B"
        value /= 1024
    raise AssertionError("unreachable")


def model_max_len(hf_config: Any) -> int:
    """The longest context the model supports, from its config.

    ``max_position_embeddings``; for ``linear``/``dynamic`` rope scaling times the factor,
    for ``yarn`` the original context times the factor (when larger), as vLLM does.
    ``llama3`` configs already state the extended length.
    """
    base = None
    for key in ("max_position_embeddings", "n_positions", "max_seq_len", "seq_length"):
        value = getattr(hf_config, key, None)
        if isinstance(value, int) and value > 0:
            base = value
            break
    if base is None:
        raise StartupError(
            "the model config states no context length (max_position_embeddings); "
            "pass --max-model-len"
        )
    rope = getattr(hf_config, "rope_parameters", None) or getattr(hf_config, "rope_scaling", None)
    if isinstance(rope, dict) and rope.get("factor"):
        rope_type = rope.get("rope_type") or rope.get("type")
        factor = float(rope["factor"])
        if rope_type in ("linear", "dynamic"):
            return int(base * factor)
        if rope_type == "yarn":
            original = int(rope.get("original_max_position_embeddings") or base)
            return max(base, int(original * factor))
    return base


def resolve_max_model_len(requested: int | None, hf_config: Any) -> int:
    """``--max-model-len``, defaulting to the model's; more than the model supports fails."""
    supported = model_max_len(hf_config)
    if requested is None:
        return supported
    if requested < 1:
        raise StartupError(f"--max-model-len must be at least 1, got {requested}")
    if requested > supported:
        raise StartupError(
            f"--max-model-len {requested} is larger than the model supports ({supported}, "
            f"from its config); pass --max-model-len {supported} or less"
        )
    return requested


@dataclass(frozen=True)
class MemoryProfile:
    """Measured device memory, in bytes (GPU)."""

    total_bytes: int
    free_bytes_at_start: int
    weights_bytes: int
    peak_activation_bytes: int
    non_torch_bytes: int = 0  # growth of memory outside torch's allocator since startup


@dataclass(frozen=True)
class MemoryPlan:
    num_blocks: int
    block_size: int
    bytes_per_block: int
    max_model_len: int

    @property
    def kv_cache_bytes(self) -> int:
        return self.num_blocks * self.bytes_per_block

    @property
    def num_tokens(self) -> int:
        return self.num_blocks * self.block_size

    @property
    def max_concurrency(self) -> float:
        """Requests of ``max_model_len`` tokens the cache holds at once."""
        return self.num_blocks / math.ceil(self.max_model_len / self.block_size)

    def check_fits_one_request(self) -> None:
        """Error (a): one full-length request must fit."""
        needed = math.ceil(self.max_model_len / self.block_size)
        if self.num_blocks >= needed:
            return
        fits = self.num_tokens
        raise StartupError(
            f"the KV cache is too small for one request of max_model_len={self.max_model_len} "
            f"tokens: it needs {needed} blocks of {self.block_size} tokens "
            f"({format_bytes(needed * self.bytes_per_block)}, "
            f"{needed * self.bytes_per_block} bytes), but the cache has {self.num_blocks} "
            f"blocks ({format_bytes(self.kv_cache_bytes)}, {self.kv_cache_bytes} bytes) = "
            f"{fits} tokens. The largest max_model_len that fits is {fits}: pass "
            f"--max-model-len {fits} or less, or give the cache more memory with "
            "--kv-cache-memory-bytes or --gpu-memory-utilization"
        )

    def log(self, weights_bytes: int) -> None:
        logger.info(
            "model weights take %s; KV cache: %d blocks x %d tokens = %d tokens (%s); "
            "maximum concurrency at max_model_len=%d: %.2fx",
            format_bytes(weights_bytes),
            self.num_blocks,
            self.block_size,
            self.num_tokens,
            format_bytes(self.kv_cache_bytes),
            self.max_model_len,
            self.max_concurrency,
        )


def check_free_memory(total_bytes: int, free_bytes: int, utilization: float) -> None:
    """Error (c): at startup the device must have ``utilization`` x total free."""
    if not 0 < utilization <= 1:
        raise StartupError(f"--gpu-memory-utilization must be in (0, 1], got {utilization}")
    requested = utilization * total_bytes
    if free_bytes >= requested:
        return
    fits = math.floor(free_bytes / total_bytes * 100) / 100
    raise StartupError(
        f"free device memory is {format_bytes(free_bytes)} of {format_bytes(total_bytes)} "
        f"total, less than --gpu-memory-utilization {utilization} asks for "
        f"({utilization} x {format_bytes(total_bytes)} = {format_bytes(requested)}); another "
        f"process may be using the GPU. Pass --gpu-memory-utilization {fits} or less, free "
        "the GPU, or set --kv-cache-memory-bytes"
    )


def _no_room_for_blocks(budget: float, bytes_per_block: int, detail: str) -> StartupError:
    """Error (b): the budget left for the cache is below one block."""
    return StartupError(
        f"no memory is left for the KV cache: {detail}, leaving {format_bytes(budget)} "
        f"({int(budget)} bytes) while one block needs {format_bytes(bytes_per_block)} "
        f"({bytes_per_block} bytes). Raise --gpu-memory-utilization or "
        "--kv-cache-memory-bytes, lower --max-num-batched-tokens / --max-num-seqs, or use "
        "a smaller or quantized model"
    )


def plan_gpu_kv_cache(
    profile: MemoryProfile,
    utilization: float,
    bytes_per_block: int,
    block_size: int,
    max_model_len: int,
    kv_cache_memory_bytes: int | None = None,
) -> MemoryPlan:
    """Size the GPU cache from the profile; raises errors (b) and (a)."""
    if kv_cache_memory_bytes is not None:
        budget = float(kv_cache_memory_bytes)
        detail = f"--kv-cache-memory-bytes is {kv_cache_memory_bytes}"
    else:
        allowed = utilization * profile.total_bytes
        used = profile.weights_bytes + profile.peak_activation_bytes + profile.non_torch_bytes
        budget = allowed - used
        detail = (
            f"--gpu-memory-utilization {utilization} x {format_bytes(profile.total_bytes)} "
            f"allows {format_bytes(allowed)}, but the weights take "
            f"{format_bytes(profile.weights_bytes)}, peak activations "
            f"{format_bytes(profile.peak_activation_bytes)} and other memory "
            f"{format_bytes(profile.non_torch_bytes)}"
        )
    num_blocks = int(budget // bytes_per_block) if budget > 0 else 0
    if num_blocks < 1:
        raise _no_room_for_blocks(budget, bytes_per_block, detail)
    plan = MemoryPlan(num_blocks, block_size, bytes_per_block, max_model_len)
    plan.check_fits_one_request()
    return plan


def default_cpu_kv_cache_bytes() -> int:
    """min(1 GiB, 25% of physical memory)."""
    try:
        ram = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        return _CPU_DEFAULT_CAP
    return int(min(_CPU_DEFAULT_CAP, ram // 4))


def plan_cpu_kv_cache(
    kv_cache_memory_bytes: int | None,
    bytes_per_block: int,
    block_size: int,
    max_model_len: int,
    max_num_seqs: int,
) -> MemoryPlan:
    """Size the CPU cache from ``--kv-cache-memory-bytes`` or the default; errors (b), (a)."""
    blocks_per_request = math.ceil(max_model_len / block_size)
    if kv_cache_memory_bytes is not None:
        budget = kv_cache_memory_bytes
        num_blocks = budget // bytes_per_block
        detail = f"--kv-cache-memory-bytes is {kv_cache_memory_bytes}"
    else:
        budget = default_cpu_kv_cache_bytes()
        # More blocks than max_num_seqs full requests could only hold cached prefixes.
        num_blocks = min(budget // bytes_per_block, max_num_seqs * blocks_per_request)
        detail = f"the default CPU KV cache budget is {budget} bytes"
        logger.info(
            "CPU KV cache: %s by default (min(1 GiB, 25%% of RAM), at most %d full "
            "requests); set --kv-cache-memory-bytes to change it",
            format_bytes(num_blocks * bytes_per_block),
            max_num_seqs,
        )
    if num_blocks < 1:
        raise _no_room_for_blocks(float(budget), bytes_per_block, detail)
    plan = MemoryPlan(int(num_blocks), block_size, bytes_per_block, max_model_len)
    plan.check_fits_one_request()
    return plan
