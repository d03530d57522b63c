"""Startup checks of ``--tensor-parallel-size``, run in the engine before any worker starts.

Each failure is a ``StartupError`` naming the flag and what would fit: sizes that split
the model's heads, the number of visible GPUs, architectures and quantization that do
not shard yet, and a script that builds the engine at import time (spawned workers
re-import the main module, so the engine must be built under ``if __name__ ==
"__main__":``).
"""

from __future__ import annotations

import multiprocessing
from typing import TYPE_CHECKING, Any

from engine_sdk.layers.parallel import valid_tensor_parallel_sizes

from engine.config import EngineArgs
from engine.errors import StartupError

if TYPE_CHECKING:
    from engine.plugins import PluginManager

__all__ = ["check_main_guard", "check_tensor_parallel"]

MAIN_GUARD_HINT = (
    "tensor parallelism starts one worker process per rank with the 'spawn' method, which "
    're-imports your script; create the engine under `if __name__ == "__main__":`'
)


def check_main_guard() -> None:
    """Refuse to start workers from a process that is itself still being spawned."""
    # multiprocessing's spawn sets ``_inheriting`` while it imports the parent's main module.
    if getattr(multiprocessing.current_process(), "_inheriting", False):
        raise StartupError(
            "the engine was created while a worker process imported your script; " + MAIN_GUARD_HINT
        )


def _model_shape(hf_config: Any) -> tuple[int, int, int]:
    num_heads = int(hf_config.num_attention_heads)
    num_kv_heads = int(getattr(hf_config, "num_key_value_heads", None) or num_heads)
    return num_heads, num_kv_heads, int(hf_config.intermediate_size)


def _check_sizes(size: int, hf_config: Any) -> None:
    num_heads, num_kv_heads, intermediate = _model_shape(hf_config)
    valid = valid_tensor_parallel_sizes(num_heads, num_kv_heads, intermediate)
    if size not in valid:
        raise StartupError(
            f"--tensor-parallel-size {size} does not split the model evenly "
            f"({num_heads} attention heads, {num_kv_heads} KV heads, intermediate size "
            f"{intermediate}); valid sizes: {', '.join(map(str, valid))}"
        )


def _check_devices(size: int, device: str) -> None:
    import torch

    if device.startswith("cuda:"):
        raise StartupError(
            f"--device {device} pins one GPU, but --tensor-parallel-size {size} uses "
            f"{size}; use --device cuda and choose GPUs with CUDA_VISIBLE_DEVICES"
        )
    if device in ("auto", "cuda") and torch.cuda.is_available():
        num_gpus = torch.cuda.device_count()
        if size > num_gpus:
            raise StartupError(
                f"--tensor-parallel-size {size} needs {size} GPUs but {num_gpus} are visible; "
                f"use --tensor-parallel-size {num_gpus} or fewer, or expose more GPUs"
            )


def check_tensor_parallel(args: EngineArgs, pm: PluginManager, hf_config: Any) -> None:
    """Every check that can fail before workers start; a no-op for size 1."""
    size = args.tensor_parallel_size
    if not isinstance(size, int) or size < 1:
        raise StartupError(f"--tensor-parallel-size must be a positive integer, got {size!r}")
    if size == 1:
        return
    check_main_guard()
    from engine.model_executor.loader import find_architecture

    model_cls = find_architecture(pm, hf_config, str(args.model))
    if not model_cls.supports_tensor_parallel:
        raise StartupError(
            f"{model_cls.__name__} does not support tensor parallelism; "
            "use --tensor-parallel-size 1"
        )
    if args.quantization or getattr(hf_config, "quantization_config", None) is not None:
        raise StartupError(
            "tensor parallelism does not support quantized models yet; "
            "use --tensor-parallel-size 1 or an unquantized checkpoint"
        )
    from engine.executor.multinode import check_multinode, ranks_per_node

    check_multinode(args)
    _check_sizes(size, hf_config)
    _check_devices(ranks_per_node(args), args.device)
