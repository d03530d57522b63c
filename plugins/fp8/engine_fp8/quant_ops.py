"""FP8 numerics: quantize / dequantize weights and activations, and the fp8 matmuls.

Scales follow the checkpoint convention: ``real = fp8_value * scale`` (for block layouts the
tensor is called ``weight_scale_inv`` but is multiplied all the same). Granularities::

    tensor   scale []                    one scale for the whole matrix
    channel  scale [out, 1]              one per output row of W [out, in]
    token    scale [num_tokens, 1]       one per activation row (dynamic)
    block    scale [ceil(out/b0), ceil(in/b1)]   one per b0 x b1 tile of W
"""

from __future__ import annotations

import torch

__all__ = [
    "FP8_DTYPE",
    "FP8_MAX",
    "MIN_SCALE",
    "dequantize",
    "fp8_linear_reference",
    "quantize_block",
    "quantize_per_channel",
    "quantize_per_tensor",
    "quantize_per_token",
    "quantize_with_scale",
    "scaled_mm",
]

FP8_DTYPE = torch.float8_e4m3fn
FP8_MAX = float(torch.finfo(torch.float8_e4m3fn).max)  # 448
MIN_SCALE = 1e-12


def _scale_of(amax: torch.Tensor) -> torch.Tensor:
    """``max(amax / 448, 1e-12)`` in float32, divided with IEEE rounding on every device.

    Dividing by the Python number would not do: on CUDA torch multiplies by its reciprocal
    instead (an ulp off for some values), so GPU and CPU scales, and the Triton kernels'
    (:mod:`engine_fp8.triton_quant`), would disagree. A 0-dim tensor on the same device
    keeps it a true division.
    """
    amax = amax.float()
    return (amax / amax.new_full((), FP8_MAX)).clamp(min=MIN_SCALE)


def quantize_with_scale(x: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """``x / scale`` saturated to the e4m3 range (a cast alone would overflow to NaN)."""
    return (x.float() / scale).clamp(-FP8_MAX, FP8_MAX).to(FP8_DTYPE)


def quantize_per_tensor(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(fp8 tensor, float32 scalar scale) with the absolute maximum mapped to 448."""
    scale = _scale_of(x.abs().amax())
    return quantize_with_scale(x, scale), scale


def quantize_per_channel(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Row-wise: (fp8 [rows, cols], float32 scale [rows, 1]); for W rows are output channels
    and for activations rows are tokens."""
    scale = _scale_of(x.abs().amax(dim=-1, keepdim=True))
    return quantize_with_scale(x, scale), scale


quantize_per_token = quantize_per_channel


def _expand_blocks(scale: torch.Tensor, shape: torch.Size, block: tuple[int, int]) -> torch.Tensor:
    rows, cols = shape
    expanded = scale.repeat_interleave(block[0], dim=0).repeat_interleave(block[1], dim=1)
    return expanded[:rows, :cols]


def quantize_block(w: torch.Tensor, block: tuple[int, int]) -> tuple[torch.Tensor, torch.Tensor]:
    """(fp8 [out, in], float32 scale_inv [ceil(out/b0), ceil(in/b1)]), one scale per tile."""
    rows, cols = w.shape
    b0, b1 = block
    num_row_blocks, num_col_blocks = -(-rows // b0), -(-cols // b1)
    padded = torch.zeros(num_row_blocks * b0, num_col_blocks * b1, dtype=torch.float32)
    padded = padded.to(w.device)
    padded[:rows, :cols] = w.float()
    tiles = padded.view(num_row_blocks, b0, num_col_blocks, b1)
    amax = tiles.abs().amax(dim=(1, 3))
    scale = _scale_of(amax)
    return quantize_with_scale(w, _expand_blocks(scale, w.shape, block)), scale


def dequantize(
    q: torch.Tensor,
    scale: torch.Tensor,
    dtype: torch.dtype = torch.float32,
    block: tuple[int, int] | None = None,
) -> torch.Tensor:
    """``q * scale`` in ``dtype``; ``block`` expands a per-tile scale to the matrix."""
    if block is not None:
        scale = _expand_blocks(scale.float(), q.shape, block)
    elif scale.numel() == 1:
        scale = scale.float().reshape(())
    return (q.float() * scale.float()).to(dtype)


def fp8_linear_reference(
    x: torch.Tensor,
    weight: torch.Tensor,
    weight_scale: torch.Tensor,
    bias: torch.Tensor | None = None,
    block: tuple[int, int] | None = None,
) -> torch.Tensor:
    """Dequantize-then-matmul in ``x.dtype``: the path for CPUs and GPUs without FP8 units."""
    w = dequantize(weight, weight_scale, x.dtype, block)
    return torch.nn.functional.linear(x, w, bias)


def _call_scaled_mm(
    a: torch.Tensor,
    b: torch.Tensor,
    scale_a: torch.Tensor,
    scale_b: torch.Tensor,
    out_dtype: torch.dtype,
) -> torch.Tensor:
    # Keyword names are stable from torch 2.1 on; 2.1-2.4 return (out, amax).
    out = torch._scaled_mm(a, b, scale_a=scale_a, scale_b=scale_b, out_dtype=out_dtype)
    if isinstance(out, tuple):
        out = out[0]
    return out


def scaled_mm(
    qx: torch.Tensor,
    x_scale: torch.Tensor,
    qweight: torch.Tensor,
    weight_scale: torch.Tensor,
    out_dtype: torch.dtype,
    bias: torch.Tensor | None = None,
) -> torch.Tensor:
    """``(qx * x_scale) @ (qweight * weight_scale).T`` on FP8 matrix units.

    ``qx`` [M, K] row-major fp8; ``qweight`` [N, K] row-major fp8 (its ``.t()`` is the
    column-major operand ``_scaled_mm`` wants); scales are per-tensor (1 element) or
    row-wise (``x_scale`` [M, 1], ``weight_scale`` [N, 1]). Row-wise needs torch >= 2.5 and a
    supported GPU; where ``_scaled_mm`` refuses it, the matmul runs with unit scales in
    float32 and the scales are applied to the output (same result, one more pass).
    """
    per_tensor = x_scale.numel() == 1 and weight_scale.numel() == 1
    if per_tensor:
        sa, sb = x_scale.float().reshape(()), weight_scale.float().reshape(())
        out = _call_scaled_mm(qx, qweight.t(), sa, sb, out_dtype)
    else:
        num_rows, num_cols = qx.shape[0], qweight.shape[0]
        sa = x_scale.float().reshape(-1, 1).expand(num_rows, 1).contiguous()
        sb = weight_scale.float().reshape(1, -1).expand(1, num_cols).contiguous()
        try:
            out = _call_scaled_mm(qx, qweight.t(), sa, sb, out_dtype)
        except (RuntimeError, TypeError):
            one = torch.ones((), dtype=torch.float32, device=qx.device)
            raw = _call_scaled_mm(qx, qweight.t(), one, one, torch.float32)
            out = (raw * sa * sb).to(out_dtype)
    if bias is not None:
        out = out + bias
    return out
