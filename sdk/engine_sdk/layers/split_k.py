"""Split-K for small-batch GEMM kernels: how many parts to split K into, and the second
pass that sums the parts.

A decode GEMM (a few activation rows) has few output tiles, too few programs to keep every
multiprocessor reading weights. Splitting the reduction dimension K into ``S`` parts gives
``S`` times the programs; each writes its partial product to ``partials[s]`` in float32
and one more launch adds them, the bias and the cast (deterministic, unlike atomic adds)::

    partials [S, M, N] float32  --sum over S, + bias, cast-->  out [M, N]

Used by the quantization plugins' kernels (AWQ W4A16, FP8 W8A16); imported only where a
kernel runs (it needs Triton).
"""

from __future__ import annotations

import functools

import torch
import triton
import triton.language as tl

__all__ = ["num_multiprocessors", "pick_split", "reduce_split_k"]

CPU_MULTIPROCESSORS = 4  # what Triton's interpreter pretends (tests on CPUs)


@functools.lru_cache(maxsize=8)
def _multiprocessors(device: torch.device) -> int:
    return int(torch.cuda.get_device_properties(device).multi_processor_count)


def num_multiprocessors(device: torch.device) -> int:
    """The device's streaming multiprocessors (``CPU_MULTIPROCESSORS`` off CUDA)."""
    if device.type != "cuda":
        return CPU_MULTIPROCESSORS
    return _multiprocessors(device)


def pick_split(num_tiles: int, num_steps: int, target_programs: int) -> tuple[int, int]:
    """``(split, steps_per_split)``: split ``num_steps`` K steps so that ``num_tiles`` output
    tiles times the split reach about ``target_programs`` programs; every part gets at
    least one step and no part is empty."""
    split = max(1, min(num_steps, -(-target_programs // max(num_tiles, 1))))
    steps_per_split = -(-num_steps // split)
    return -(-num_steps // steps_per_split), steps_per_split


@triton.jit  # type: ignore[untyped-decorator]
def _reduce_kernel(  # type: ignore[no-untyped-def]
    partials_ptr,
    bias_ptr,
    out_ptr,
    N,
    num_parts,
    stride_part,
    stride_pm,
    stride_om,
    HAS_BIAS: tl.constexpr,
    BLOCK: tl.constexpr,
):
    row = tl.program_id(0)
    cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    mask = cols < N
    acc = tl.zeros((BLOCK,), dtype=tl.float32)
    for part in range(num_parts):
        acc += tl.load(partials_ptr + part * stride_part + row * stride_pm + cols, mask=mask)
    if HAS_BIAS:
        acc += tl.load(bias_ptr + cols, mask=mask).to(tl.float32)
    tl.store(out_ptr + row * stride_om + cols, acc.to(out_ptr.dtype.element_ty), mask=mask)


def reduce_split_k(
    partials: torch.Tensor, bias: torch.Tensor | None, out_dtype: torch.dtype
) -> torch.Tensor:
    """``partials.sum(0) + bias`` in ``out_dtype``: [S, M, N] float32 -> [M, N]."""
    num_parts, num_rows, num_cols = partials.shape
    assert partials.dtype == torch.float32 and partials.stride(2) == 1
    out = torch.empty(num_rows, num_cols, dtype=out_dtype, device=partials.device)
    if num_rows == 0:
        return out
    block = min(1024, triton.next_power_of_2(num_cols))
    _reduce_kernel[(num_rows, triton.cdiv(num_cols, block))](
        partials, bias if bias is not None else partials, out, num_cols, num_parts,
        partials.stride(0), partials.stride(1), out.stride(0),
        HAS_BIAS=bias is not None, BLOCK=block, num_warps=4,
    )  # fmt: skip
    return out
