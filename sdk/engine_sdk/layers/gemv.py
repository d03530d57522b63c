"""Small-batch GEMM as a Triton GEMV: ``x @ W.T (+ b)`` for at most ``MAX_ROWS`` rows.

At one to a few activation rows a projection reads its whole weight to do almost no
arithmetic, so its speed is the weight read. cuBLAS picks tiles made for larger batches
and reached about a quarter of the H200's copy bandwidth on the Qwen3-0.6B projections
(docs/performance.md). This kernel gives each program ``BLOCK_N`` weight rows read in
``BLOCK_K`` chunks, enough programs to keep every multiprocessor loading, and reuses each
loaded tile for all activation rows::

    program p:  rows p*BLOCK_N .. +BLOCK_N of W [N, K]  x  x [M, K]  ->  out[:, those rows]

``use_gemv`` decides per call (CUDA, bf16/fp16, contiguous weight, at most ``MAX_ROWS``
rows, ``ENGINE_GEMV`` not ``0``); ``ENGINE_GEMV=force`` also runs it on the CPU through
Triton's interpreter (tests). The tile sizes come from ``pick_tiles``.
"""

from __future__ import annotations

import functools
import os

import torch

__all__ = ["MAX_ROWS", "gemv", "pick_tiles", "use_gemv"]

MAX_ROWS = 4  # rows at or below which the GEMV replaces the library GEMM
TARGET_PROGRAMS_PER_SM = 4  # programs per multiprocessor that hide the load latency
_DTYPES = (torch.bfloat16, torch.float16)


@functools.lru_cache(maxsize=1)
def _kernel() -> object | None:
    try:
        from engine_sdk.layers._gemv_kernels import gemv_kernel
    except ImportError:
        return None
    kernel: object = gemv_kernel
    return kernel


@functools.lru_cache(maxsize=8)
def _multiprocessors(index: int) -> int:
    return int(torch.cuda.get_device_properties(index).multi_processor_count)


def use_gemv(x: torch.Tensor, weight: torch.Tensor) -> bool:
    """Whether ``gemv`` runs for this call (see the module docstring)."""
    mode = os.environ.get("ENGINE_GEMV", "1")
    if mode == "0" or x.dim() != 2 or not 0 < x.shape[0] <= MAX_ROWS:
        return False
    if not x.is_cuda and mode != "force":
        return False
    return (
        x.dtype in _DTYPES
        and weight.dtype == x.dtype
        and weight.dim() == 2
        and weight.stride(1) == 1
        and x.stride(1) == 1
        and _kernel() is not None
    )


def pick_tiles(n: int, k: int, multiprocessors: int) -> tuple[int, int, int]:
    """``(BLOCK_N, BLOCK_K, num_warps)``: the widest row block (at most 16) that still
    gives ``TARGET_PROGRAMS_PER_SM`` programs per multiprocessor, and K chunks of 1024
    (or all of a smaller K)."""
    block_n = 16
    while block_n > 1 and -(-n // block_n) < TARGET_PROGRAMS_PER_SM * multiprocessors:
        block_n //= 2
    block_k = min(1024, max(16, 1 << (k - 1).bit_length()))
    return block_n, block_k, 4


def gemv(
    x: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None = None,
    tiles: tuple[int, int, int] | None = None,
) -> torch.Tensor:
    """``x @ weight.T + bias`` for ``x`` [M, K] (M at most ``MAX_ROWS``), ``weight`` [N, K]."""
    kernel = _kernel()
    assert kernel is not None
    num_rows, k = x.shape
    n = weight.shape[0]
    out = torch.empty(num_rows, n, dtype=x.dtype, device=x.device)
    sms = _multiprocessors(x.device.index or 0) if x.is_cuda else 4
    block_n, block_k, warps = tiles or pick_tiles(n, k, sms)
    block_m = max(1, 1 << (num_rows - 1).bit_length())
    kernel[(-(-n // block_n),)](  # type: ignore[index]
        x, weight, bias if bias is not None else weight, out, num_rows, n, k,
        x.stride(0), weight.stride(0), out.stride(0),
        HAS_BIAS=bias is not None, BLOCK_M=block_m, BLOCK_N=block_n, BLOCK_K=block_k,
        num_warps=warps,
    )  # fmt: skip
    return out
