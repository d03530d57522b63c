"""The AWQ linear method: packed 4-bit parameters of one layer and its matmul.

Parameters are the checkpoint's, by name: ``qweight`` int32 [in, out/8], ``qzeros`` int32
[in/group, out/8], ``scales`` fp16 [in/group, out] (layout in :mod:`engine_awq.packing`).

Load time (``process_weights_after_loading``): on CUDA with Triton the packed tensors are
repacked into the tiled layout the W4A16 kernels read (:mod:`engine_awq.tiled`:
``tiled_qweight`` int32 [N, K/8], ``tiled_zeros`` uint8 [K/G, N], ``scales`` unchanged)
and ``qweight`` / ``qzeros`` are dropped; elsewhere the checkpoint layout stays.

Matmul paths (:func:`select_path`), checked in this order; each threshold is one constant,
to retune from ``benchmarks/quant_gemv_gpu.py`` / ``quant_kernels_gpu.py``:

- tiled, fp16/bf16 activations, up to ``ROW_GEMV_MAX_TOKENS`` tokens: ``rows``, the row
  GEMV (:mod:`engine_awq.rows`: whole-K columns per program, the launch shape of the SDK's
  bf16 GEMV), which also takes the decoder's add+RMSNorm
  (:meth:`AwqLinearMethod.apply_add_rms_norm`) and, for the merged gate/up, the SiLU
  (:meth:`AwqLinearMethod.apply_add_rms_norm_silu`), so a one-token step has as many
  launches as bf16's, on rows of at most ``ROWS_FUSE_NORM_MAX_K`` activations
  (``ENGINE_AWQ_FUSE_NORM_MAX_K``). Longer rows leave the add+RMSNorm and the SiLU to the
  decoder's own kernels: the fused launches normalize the activations in every program,
  which made the gate/up launch issue-bound (7.5 instructions a weight in sm90 code against
  4.8 without the norm), and on the Llama-3.1-8B shape (hidden 4096) the three extra
  launches a layer cost less than that (W2 on an H100, 2026-12-07: 3.147 against 3.585 ms a
  token). ``ENGINE_AWQ_ROW_GEMV`` sets the tokens (0: off). Measured on an
  H100 (2026-12-06) at one token it beats the split-K GEMV on both shapes: W2 0.6B 1.010
  against 1.336 ms a token, 8B 3.815 against 4.189;
- tiled, fp16/bf16 activations, up to ``GEMV_MAX_TOKENS`` tokens (decode): ``gemv``, the
  split-K W4A16 GEMV in one launch (:mod:`engine_awq.gemv`; CUDA cores up to
  ``GEMV_FMA_MAX_TOKENS`` tokens, tensor cores above);
- up to ``FMA_MAX_TOKENS``: ``fma``, the W4A16 GEMM on CUDA cores; up to
  ``DOT_MAX_TOKENS``: ``dot``, the same GEMM on tensor cores (:mod:`engine_awq.w4a16`,
  split-K parts added by a second launch). With ``GEMV_MAX_TOKENS`` at 16, ``fma`` is not
  reached;
- tiled, more tokens (prefill) or other dtypes: ``dequant``, the dense weight written by one
  Triton pass, then the dense matmul (compute-bound there);
- checkpoint layout (CPU, CUDA without Triton): ``reference``, torch dequantize then matmul.

The GEMV's split-K counters live on the layer (``gemv_locks``, a non-persistent buffer made
with the tiled layout; they return to zero after every call, so CUDA graphs replay them).

Merging (:meth:`AwqLinearMethod.merge`, for q/k/v and gate/up): the tensors are
concatenated along their output (N) dimension, which no packing crosses, so one kernel
launch computes all::

    tiled_qweight [Nq | Nk | Nv, K/8]   tiled_zeros [K/G, Nq | ...]   scales [K/G, Nq | ...]
    (checkpoint layout: qweight [K, Nq/8 | Nk/8 | Nv/8], qzeros [K/G, Nq/8 | ...])

The original layers keep views of the merged tensors (row blocks of ``tiled_qweight``,
column blocks of the others), which the kernels read through their strides.

A layer whose K or group size fits no tiled chunk (K not a multiple of 32, or a group size
not a multiple of 4) keeps the checkpoint layout and the reference path, also on CUDA.
"""

from __future__ import annotations

import os
from collections.abc import Sequence

import torch
from engine_sdk.interfaces.quantization import QuantizationMethod
from engine_sdk.layers.linear import share_merged
from engine_sdk.runtime import quant_gemv_enabled, triton_available

from engine_awq.packing import PACK_FACTOR, awq_dequantize
from engine_awq.tiled import dequantize_tiled, pick_chunk, repack_tiled

__all__ = [
    "DOT_MAX_TOKENS",
    "ROWS_MAX_TOKENS",
    "ROWS_FUSE_NORM_MAX_K",
    "ROWS_NORM_MAX_K",
    "ROW_GEMV_MAX_TOKENS",
    "FMA_MAX_TOKENS",
    "GEMV_FMA_MAX_TOKENS",
    "GEMV_MAX_TOKENS",
    "AwqLinearMethod",
    "select_path",
]

# split-K GEMV up to here (at most engine_awq.gemv.MAX_TOKENS); 0 (off) when
# engine_sdk.runtime.quant_gemv_enabled() says no (ENGINE_QUANT_GEMV=0).
GEMV_MAX_TOKENS = 16 if quant_gemv_enabled() else 0
ROWS_MAX_TOKENS = 4  # the row GEMV (engine_awq.rows) takes 1 to this many rows
ROWS_NORM_MAX_K = 8192  # ... and its add+RMSNorm prologue rows of at most this length
# one-token rows longer than this leave the add+RMSNorm and SiLU to the decoder's kernels
ROWS_FUSE_NORM_MAX_K = int(os.environ.get("ENGINE_AWQ_FUSE_NORM_MAX_K", "2048"))
# the row GEMV up to here, within the gemv path: one token, until a sweep measures more
ROW_GEMV_MAX_TOKENS = min(
    GEMV_MAX_TOKENS, ROWS_MAX_TOKENS, int(os.environ.get("ENGINE_AWQ_ROW_GEMV", "1"))
)
GEMV_FMA_MAX_TOKENS = 1  # ... on CUDA cores up to here, tensor cores above (first guess)
FMA_MAX_TOKENS = 4  # CUDA-core W4A16 GEMM up to here (below GEMV_MAX_TOKENS: not reached)
DOT_MAX_TOKENS = 256  # tensor-core W4A16 up to here, then dequantize + dense matmul
_MIN_GEMV_BLOCK_N = 16  # the narrowest GEMV tile: one split-K counter per 16 columns
_KERNEL_DTYPES = (torch.float16, torch.bfloat16)


def kernels_usable(device: torch.device) -> bool:
    """Whether the Triton W4A16 kernels run on ``device`` (CUDA with Triton)."""
    return device.type == "cuda" and triton_available()


def select_path(layer: torch.nn.Module, num_tokens: int, dtype: torch.dtype) -> str:
    """``rows`` | ``gemv`` | ``fma`` | ``dot`` | ``dequant`` | ``reference`` for
    ``num_tokens`` rows of ``dtype`` (see the module docstring)."""
    chunk = getattr(layer, "awq_chunk", None)
    if chunk is None:
        return "reference"
    if dtype not in _KERNEL_DTYPES or num_tokens == 0:
        return "dequant"
    if num_tokens <= ROW_GEMV_MAX_TOKENS:
        return "rows"
    if num_tokens <= GEMV_MAX_TOKENS:
        return "gemv"
    if num_tokens <= FMA_MAX_TOKENS:
        return "fma"
    if num_tokens <= DOT_MAX_TOKENS and chunk == 128:
        return "dot"
    return "dequant"


def _exact_loader(layer_name: str):  # type: ignore[no-untyped-def]
    """Copy a packed tensor, refusing a dtype change (a float qweight is not AWQ)."""

    def load(param: torch.nn.Parameter, tensor: torch.Tensor) -> None:
        if tuple(tensor.shape) != tuple(param.shape):
            raise ValueError(
                f"{layer_name}: AWQ tensor has shape {tuple(tensor.shape)}, the layer expects "
                f"{tuple(param.shape)}; check group_size in quantization_config"
            )
        if param.dtype == torch.int32 and tensor.dtype != torch.int32:
            raise ValueError(
                f"{layer_name}: packed AWQ tensor is {tensor.dtype}, expected int32 "
                "(AutoAWQ GEMM layout)"
            )
        param.data.copy_(tensor)

    return load


class AwqLinearMethod(QuantizationMethod):
    """AutoAWQ GEMM 4-bit weights with zero points, ``group_size`` rows per scale."""

    def __init__(self, group_size: int) -> None:
        self.group_size = group_size

    def create_weights(
        self,
        layer: torch.nn.Module,
        input_size: int,
        output_size: int,
        params_dtype: torch.dtype,
    ) -> None:
        name = getattr(layer, "prefix", "") or "linear"
        group_size = input_size if self.group_size == -1 else self.group_size
        if output_size % PACK_FACTOR:
            raise ValueError(
                f"{name}: AWQ packs 8 output columns per int32 but out_features is "
                f"{output_size}; this layer cannot be AWQ-quantized"
            )
        if input_size % group_size:
            raise ValueError(
                f"{name}: in_features {input_size} is not a multiple of AWQ group_size "
                f"{group_size}; the checkpoint's group_size must divide every layer's input"
            )
        layer.awq_group_size = group_size
        num_groups = input_size // group_size
        tensors = {
            "qweight": torch.empty(input_size, output_size // PACK_FACTOR, dtype=torch.int32),
            "qzeros": torch.empty(num_groups, output_size // PACK_FACTOR, dtype=torch.int32),
            "scales": torch.empty(num_groups, output_size, dtype=torch.float16),
        }
        for param_name, tensor in tensors.items():
            param = torch.nn.Parameter(tensor, requires_grad=False)
            param.weight_loader = _exact_loader(f"{name}.{param_name}")  # type: ignore[attr-defined]
            layer.register_parameter(param_name, param)

    def process_weights_after_loading(self, layer: torch.nn.Module) -> None:
        layer.awq_chunk = None
        if kernels_usable(layer.qweight.device):
            self.repack(layer)

    def repack(self, layer: torch.nn.Module) -> bool:
        """Switch ``layer`` to the tiled layout the kernels read (on its device; also on a
        CPU, where Triton's interpreter runs them in tests). False when no chunk fits."""
        chunk = pick_chunk(layer.qweight.shape[0], layer.awq_group_size)
        if chunk is None:
            return False
        tiled, zeros = repack_tiled(layer.qweight.data, layer.qzeros.data, chunk)
        del layer.qweight, layer.qzeros
        layer.register_parameter("tiled_qweight", _frozen(tiled))
        layer.register_parameter("tiled_zeros", _frozen(zeros))
        layer.awq_chunk = chunk
        _add_gemv_locks(layer, tiled.shape[0], tiled.device)
        return True

    def dequantize_weight(self, layer: torch.nn.Module, dtype: torch.dtype) -> torch.Tensor:
        """The layer's weight as ``dtype`` [out, in] (``nn.Linear`` orientation)."""
        group_size = layer.awq_group_size
        if layer.awq_chunk is not None:
            w = dequantize_tiled(
                layer.tiled_qweight, layer.tiled_zeros, layer.scales, group_size,
                layer.awq_chunk, dtype,
            )  # fmt: skip
        else:
            w = awq_dequantize(layer.qweight, layer.qzeros, layer.scales, group_size, dtype)
        return w.t()

    def apply(
        self, layer: torch.nn.Module, x: torch.Tensor, bias: torch.Tensor | None = None
    ) -> torch.Tensor:
        x2 = x.reshape(-1, x.shape[-1])
        path = select_path(layer, x2.shape[0], x.dtype)
        if path == "reference":
            w = awq_dequantize(
                layer.qweight, layer.qzeros, layer.scales, layer.awq_group_size, x.dtype
            )
            out = x2 @ w
            if bias is not None:
                out = out + bias
        elif path == "dequant":
            from engine_awq.w4a16 import awq_w4a16_dequantize

            w = awq_w4a16_dequantize(
                layer.tiled_qweight, layer.tiled_zeros, layer.scales, layer.awq_group_size,
                layer.awq_chunk, x.dtype,
            )  # fmt: skip
            out = torch.nn.functional.linear(x2, w, None if bias is None else bias.to(x.dtype))
        elif path == "rows":
            from engine_awq.rows import awq_rows

            x2 = x2 if x2.stride(-1) == 1 else x2.contiguous()
            out = awq_rows(x2, *_tiled_weights(layer), bias)
        elif path == "gemv":
            from engine_awq.gemv import awq_gemv

            x2 = x2 if x2.stride(-1) == 1 else x2.contiguous()
            out = awq_gemv(x2, *_tiled_weights(layer), bias, None, layer.gemv_locks)
        else:
            from engine_awq.w4a16 import awq_w4a16_gemm, default_config

            x2 = x2 if x2.stride(-1) == 1 else x2.contiguous()
            num_out = layer.tiled_qweight.shape[0]
            config = default_config(x2.shape[0], num_out, layer.awq_chunk, path)
            out = awq_w4a16_gemm(
                x2, layer.tiled_qweight, layer.tiled_zeros, layer.scales,
                layer.awq_group_size, layer.awq_chunk, bias, config,
            )  # fmt: skip
        return out.reshape(*x.shape[:-1], out.shape[-1])

    def apply_add_rms_norm(
        self,
        layer: torch.nn.Module,
        x: torch.Tensor,
        residual: torch.Tensor,
        norm_weight: torch.Tensor,
        eps: float,
        bias: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor] | None:
        """The decoder's residual add and RMSNorm inside the decode GEMV where the call
        takes the ``rows`` path (:func:`engine_awq.rows.awq_rows_add_rms_norm`) or the
        ``gemv`` path (:func:`engine_awq.gemv.awq_gemv_add_rms_norm`) with at most
        ``NORM_MAX_ROWS`` rows; else None (the decoder's own kernels)."""
        path = _norm_fusion_path(layer, x, residual, norm_weight)
        if path == "rows":
            from engine_awq.rows import awq_rows_add_rms_norm

            weights = _tiled_weights(layer)
            return awq_rows_add_rms_norm(x, residual, norm_weight, eps, *weights, bias)
        if path != "gemv":
            return None
        from engine_awq.gemv import awq_gemv_add_rms_norm

        return awq_gemv_add_rms_norm(
            x, residual, norm_weight, eps, *_tiled_weights(layer), bias, None, layer.gemv_locks
        )

    def apply_add_rms_norm_silu(
        self,
        layer: torch.nn.Module,
        x: torch.Tensor,
        residual: torch.Tensor,
        norm_weight: torch.Tensor,
        eps: float,
        bias: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor] | None:
        """The norm, the merged gate/up and SiLU-and-mul in one launch
        (:func:`engine_awq.rows.awq_rows_add_rms_norm` with ``gated``) where the call
        takes the ``rows`` path; else None."""
        if _norm_fusion_path(layer, x, residual, norm_weight) != "rows":
            return None
        if layer.tiled_qweight.shape[0] % 2:
            return None
        from engine_awq.rows import awq_rows_add_rms_norm

        weights = _tiled_weights(layer)
        return awq_rows_add_rms_norm(x, residual, norm_weight, eps, *weights, bias, gated=True)

    def merge(
        self, layers: Sequence[torch.nn.Module], merged: torch.nn.Module
    ) -> QuantizationMethod | None:
        """Concatenate the packed tensors along N; ``None`` unless the layers share the
        group size, the layout (checkpoint or tiled, and its chunk) and the tensors' dtypes
        and device."""
        first = layers[0]
        same = all(
            isinstance(layer.quant_method, AwqLinearMethod)
            and layer.awq_group_size == first.awq_group_size
            and getattr(layer, "awq_chunk", None) == getattr(first, "awq_chunk", None)
            for layer in layers
        )
        if not same:
            return None
        tiled = getattr(first, "awq_chunk", None) is not None
        names = _TILED_NAMES if tiled else _PACKED_NAMES
        if len({_tensor_kinds(layer, names) for layer in layers}) != 1:
            return None
        for name in names:
            # tiled_qweight is [N, K/8]: its output dimension is 0; the others' is 1.
            dim = 0 if name == "tiled_qweight" else 1
            tensor = torch.cat([getattr(layer, name).data for layer in layers], dim=dim)
            merged.register_parameter(name, _frozen(tensor))
            sizes = [getattr(layer, name).shape[dim] for layer in layers]
            share_merged(layers, name, tensor, dim=dim, sizes=sizes)
        merged.awq_group_size = first.awq_group_size
        merged.awq_chunk = getattr(first, "awq_chunk", None)
        if tiled:
            _add_gemv_locks(merged, merged.tiled_qweight.shape[0], merged.tiled_qweight.device)
        return AwqLinearMethod(self.group_size)


_PACKED_NAMES = ("qweight", "qzeros", "scales")
_TILED_NAMES = ("tiled_qweight", "tiled_zeros", "scales")


def _tiled_weights(
    layer: torch.nn.Module,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, int, int]:
    """The tiled layout's operands of the GEMV functions, in their order."""
    return (
        layer.tiled_qweight, layer.tiled_zeros, layer.scales, layer.awq_group_size,
        layer.awq_chunk,
    )  # fmt: skip


def _norm_fusion_path(
    layer: torch.nn.Module, x: torch.Tensor, residual: torch.Tensor, norm_weight: torch.Tensor
) -> str | None:
    """The GEMV that takes the add+RMSNorm of this call: ``rows`` (rows of at most
    ``ROWS_NORM_MAX_K``), ``gemv`` (the split-K GEMV's prologue, also for longer rows on
    the ``rows`` path), or None (operands no prologue takes, another path, or rows longer
    than ``ROWS_FUSE_NORM_MAX_K`` on the ``rows`` path: the module docstring)."""
    from engine_sdk.layers.split_k import fuses_add_rms_norm

    if not fuses_add_rms_norm(x, residual, norm_weight):  # [M, K] with M <= NORM_MAX_ROWS
        return None
    path = select_path(layer, x.shape[0], x.dtype)
    if path == "rows":
        if x.shape[1] > ROWS_FUSE_NORM_MAX_K:
            return None
        return "rows" if x.shape[1] <= ROWS_NORM_MAX_K else "gemv"
    return "gemv" if path == "gemv" else None


def _add_gemv_locks(layer: torch.nn.Module, num_out: int, device: torch.device) -> None:
    """The layer's split-K counters for the GEMV (:mod:`engine_awq.gemv`): one per output
    tile of the narrowest tile, zero between calls."""
    from engine_sdk.layers.split_k import split_k_locks

    locks = split_k_locks(-(-num_out // _MIN_GEMV_BLOCK_N), device)
    layer.register_buffer("gemv_locks", locks, persistent=False)


def _frozen(tensor: torch.Tensor) -> torch.nn.Parameter:
    return torch.nn.Parameter(tensor, requires_grad=False)


def _tensor_kinds(
    layer: torch.nn.Module, names: tuple[str, ...]
) -> tuple[tuple[torch.dtype, torch.device], ...]:
    return tuple((getattr(layer, n).dtype, getattr(layer, n).device) for n in names)
