"""Activation quantization to float8 e4m3 in Triton: one launch per call where torch needs
several (abs, amax, divide, clamp, cast, each a pass over the activations).

Same numbers as :mod:`engine_fp8.quant_ops`, bit for bit: the maximum is exact in any
order, the scale is ``max(amax / 448, 1e-12)`` and the value ``clamp(x / scale, +-448)``,
both divided with IEEE rounding (``div_rn``, as torch divides) and cast to e4m3 with round
to nearest even. One program per activation row; a row longer than ``BLOCK`` is read in
``BLOCK`` chunks twice (maximum, then quantize; the second read comes from cache)::

    x [M, K]  ->  q [M, K] fp8
                  scale [M, 1] float32   per token: each row's own
                  scale []  or [M, 1]    per tensor / static: one value (repeated per row
                                         when ``row_scales``, the form ``_scaled_mm``
                                         takes next to per-channel weight scales)

Per tensor, up to ``SMALL_TENSOR_ROWS`` rows every program reads all rows for the maximum
(one launch); above, row maxima meet in an atomic maximum first (a zero fill and two
launches).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from engine_fp8.quant_ops import FP8_DTYPE, FP8_MAX, MIN_SCALE

__all__ = ["quantize", "quantize_per_tensor", "quantize_per_token", "quantize_with_scale"]

MAX_BLOCK = 4096
SMALL_TENSOR_ROWS = 4  # H200: all-rows beats zero fill + atomic max up to 4 rows

# Where a program's scale comes from (MODE).
_STATIC = 0  # scale_in_ptr holds it (a calibrated input_scale)
_PER_ROW = 1  # the row's own maximum
_TENSOR_AMAX = 2  # scale_in_ptr holds the tensor maximum (from _amax_kernel)
_TENSOR_ALL_ROWS = 3  # the maximum over all rows, read by every program


@triton.jit
def _row_amax(x_row, num_cols, BLOCK: tl.constexpr):
    amax = tl.zeros((BLOCK,), dtype=tl.float32)
    for start in range(0, num_cols, BLOCK):
        cols = start + tl.arange(0, BLOCK)
        x = tl.load(x_row + cols, mask=cols < num_cols, other=0.0).to(tl.float32)
        amax = tl.maximum(amax, tl.abs(x))
    return tl.max(amax, axis=0)


@triton.jit
def _amax_kernel(x_ptr, amax_ptr, num_cols, stride_x, BLOCK: tl.constexpr):
    row = tl.program_id(0)
    tl.atomic_max(amax_ptr, _row_amax(x_ptr + row * stride_x, num_cols, BLOCK))


@triton.jit
def _quantize_kernel(
    x_ptr,
    q_ptr,
    scale_in_ptr,
    scale_out_ptr,
    num_rows,
    num_cols,
    stride_x,
    stride_q,
    fp8_max,
    min_scale,
    MODE: tl.constexpr,
    ROW_SCALES: tl.constexpr,
    BLOCK: tl.constexpr,
):
    row = tl.program_id(0)
    x_row = x_ptr + row * stride_x
    # float32 whatever the caller passes (torch.compile hands Python floats as float64,
    # for which there is neither div_rn nor a conversion to fp8)
    fp8_max = tl.full([], fp8_max, tl.float32)
    min_scale = tl.full([], min_scale, tl.float32)
    if MODE == 0:
        scale = tl.load(scale_in_ptr)
    else:
        if MODE == 1:
            amax = _row_amax(x_row, num_cols, BLOCK)
        elif MODE == 2:
            amax = tl.load(scale_in_ptr)
        else:
            amax = _row_amax(x_ptr, num_cols, BLOCK)
            for other in range(1, num_rows):
                amax = tl.maximum(amax, _row_amax(x_ptr + other * stride_x, num_cols, BLOCK))
        scale = tl.maximum(tl.math.div_rn(amax, fp8_max), min_scale)
    if ROW_SCALES:
        tl.store(scale_out_ptr + row, scale)
    elif MODE != 0:
        tl.store(scale_out_ptr, scale, mask=row == 0)
    for start in range(0, num_cols, BLOCK):
        cols = start + tl.arange(0, BLOCK)
        mask = cols < num_cols
        x = tl.load(x_row + cols, mask=mask, other=0.0).to(tl.float32)
        q = tl.math.div_rn(x, scale)
        q = tl.minimum(tl.maximum(q, -fp8_max), fp8_max)
        tl.store(q_ptr + row * stride_q + cols, q.to(q_ptr.dtype.element_ty), mask=mask)


def _block(num_cols: int) -> tuple[int, int]:
    """(BLOCK, num_warps) for rows of ``num_cols``."""
    block = min(triton.next_power_of_2(max(num_cols, 1)), MAX_BLOCK)
    return block, 4 if block <= 1024 else 8


def quantize(
    x: torch.Tensor,
    strategy: str,
    static_scale: torch.Tensor | None = None,
    row_scales: bool = False,
) -> tuple[torch.Tensor, torch.Tensor]:
    """(fp8 [M, K], float32 scale) of activations ``x`` [M, K].

    ``strategy``: ``"token"`` (scale [M, 1]), ``"tensor"`` (dynamic, one scale) or
    ``"static"`` (``static_scale``, one float32 element). ``row_scales`` returns a
    one-value scale as [M, 1] (written by the kernel, no extra copy); otherwise it is the
    dynamic scalar ``[]`` or ``static_scale`` itself.
    """
    x = x if x.stride(-1) == 1 else x.contiguous()
    num_rows, num_cols = x.shape
    block, num_warps = _block(num_cols)
    q = torch.empty(num_rows, num_cols, dtype=FP8_DTYPE, device=x.device)
    if num_rows == 0:  # nothing to launch; the scale's shape as for a non-empty x
        if row_scales or strategy == "token":
            return q, torch.empty(0, 1, dtype=torch.float32, device=x.device)
        if strategy == "static" and static_scale is not None:
            return q, static_scale
        return q, torch.full((), MIN_SCALE, dtype=torch.float32, device=x.device)
    scale_in: torch.Tensor | None = None
    if strategy == "static":
        assert static_scale is not None and static_scale.numel() == 1
        assert static_scale.dtype == torch.float32
        mode, scale_in = _STATIC, static_scale
    elif strategy == "token":
        mode, row_scales = _PER_ROW, True
    elif strategy == "tensor" and num_rows <= SMALL_TENSOR_ROWS:
        mode = _TENSOR_ALL_ROWS
    elif strategy == "tensor":
        mode = _TENSOR_AMAX
        scale_in = torch.zeros(1, dtype=torch.float32, device=x.device)
        _amax_kernel[(num_rows,)](
            x, scale_in, num_cols, x.stride(0), BLOCK=block, num_warps=num_warps
        )
    else:
        raise ValueError(f"unknown activation strategy {strategy!r}")
    if row_scales:
        scale_out = torch.empty(num_rows, 1, dtype=torch.float32, device=x.device)
    elif mode == _STATIC:
        assert static_scale is not None
        scale_out = static_scale
    else:
        scale_out = torch.empty((), dtype=torch.float32, device=x.device)
    _quantize_kernel[(num_rows,)](
        x,
        q,
        scale_out if scale_in is None else scale_in,
        scale_out,
        num_rows,
        num_cols,
        x.stride(0),
        q.stride(0),
        FP8_MAX,
        MIN_SCALE,
        MODE=mode,
        ROW_SCALES=row_scales,
        BLOCK=block,
        num_warps=num_warps,
    )
    return q, scale_out


def quantize_per_token(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(fp8 [M, K], float32 scale [M, 1]), one scale per row: one launch."""
    return quantize(x, "token")


def quantize_per_tensor(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(fp8 [M, K], float32 scalar scale) with the tensor maximum mapped to 448."""
    return quantize(x, "tensor")


def quantize_with_scale(x: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """fp8 [M, K] of ``x / scale`` for a one-element float32 ``scale`` (static activations)."""
    return quantize(x, "static", scale)[0]
