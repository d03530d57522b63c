"""The FP8 linear method: parameters of one layer, post-load conversion and the matmul.

One class serves every layout the plugin reads; :class:`Fp8Scheme` says which:

=============  ==========================  =========================================
layout         parameters                  notes
=============  ==========================  =========================================
online         ``weight`` (model dtype)    quantized in ``process_weights_after_loading``
tensor         ``weight`` fp8, scale []    ``weight_scale``
channel        ``weight`` fp8, scale [N,1] ``weight_scale``
block          ``weight`` fp8, scale tiles ``weight_scale_inv`` (fp8) / ``weight_scale`` (c-t)
static acts    ``input_scale`` []          activations quantized with the calibrated scale
=============  ==========================  =========================================

Matmul paths (:func:`select_path`), on a CUDA GPU with FP8 matrix units (compute
capability >= 8.9) and Triton, for fp16/bf16 activations, checked in this order (each
threshold one constant, to retune from ``benchmarks/quant_gemv_gpu.py``):

- ``rows``: one token (and 2-4 on small weights, as the SDK's ``gemv.prefer_gemv``),
  tensor and channel layouts: the SDK's row GEMV (:mod:`engine_sdk.layers.gemv`, the
  launch bf16 weights take) reading the fp8 weight with its scale, with the add+RMSNorm
  (:meth:`Fp8LinearMethod.apply_add_rms_norm`) and the gated SiLU
  (:meth:`Fp8LinearMethod.apply_add_rms_norm_silu`) in the same launch, so a decode step
  has as many launches as bf16's; ``ENGINE_FP8_ROW_GEMV=0`` leaves these calls to
  ``gemv``. Its decision is :meth:`Fp8LinearMethod.row_gemv_scale`;
- ``gemv``: up to ``GEMV_MAX_TOKENS`` tokens (decode), every layout: the weight-only
  split-K GEMV in one launch (:mod:`engine_fp8.gemv`; CUDA cores up to
  ``GEMV_FMA_MAX_TOKENS`` tokens, tensor cores above) reads the fp8 weight once, upcasts it
  in registers and applies tensor, channel or block scales; activations are not quantized.
  Its split-K counters live on the layer (``gemv_locks``, zero between calls);
- ``w8a16``: up to ``W8A16_MAX_TOKENS`` tokens, every layout: the weight-only Triton GEMM
  (:mod:`engine_fp8.w8a16`, split-K parts added by a second launch; with
  ``GEMV_MAX_TOKENS`` at 16 it takes no scaled_mm layout). Layouts without a ``_scaled_mm``
  path (block scales, weight-only schemes) use it up to ``W8A16_DENSE_MAX_TOKENS``
  tokens, where the alternative dequantizes the whole weight;
- ``scaled_mm``: more tokens, tensor/channel layouts: ``torch._scaled_mm`` with activations
  quantized per call (dynamic: per tensor or per token; static: ``input_scale``) by one
  Triton kernel (:mod:`engine_fp8.triton_quant`; torch ops when Triton is missing);
- ``reference``: everything else (CPUs, GPUs below 8.9, block layouts with many tokens):
  the weight dequantized to the activation dtype and multiplied (weight-only FP8).

Merging (:meth:`Fp8LinearMethod.merge`, for q/k/v and gate/up): the fp8 weights are
concatenated along the output dimension and the scales become one per output channel
(a per-tensor scale repeated over its layer's rows), so the merged layer runs the channel
layout: one activation quantization and one ``_scaled_mm`` with row-wise scales::

    q [Nq, K] scale sq     ┐      weight [Nq+Nk+Nv, K]
    k [Nk, K] scale sk     ├──>   weight_scale [sq]*Nq + [sk]*Nk + [sv]*Nv   ([N, 1])
    v [Nv, K] scale sv     ┘

Block layouts merge when every layer but the last fills whole blocks of rows (the scale
tiles stack); static activations only when all layers share one ``input_scale`` (a common
larger scale would change every other layer's rounding).
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass, replace

import torch
from engine_sdk.interfaces.quantization import QuantizationMethod
from engine_sdk.layers import gemv as row_gemv
from engine_sdk.layers.linear import share_merged
from engine_sdk.runtime import quant_gemv_enabled, triton_available

from engine_fp8 import quant_ops

__all__ = [
    "GEMV_FMA_MAX_TOKENS",
    "GEMV_MAX_TOKENS",
    "W8A16_DENSE_MAX_TOKENS",
    "W8A16_FMA_MAX_TOKENS",
    "W8A16_MAX_TOKENS",
    "Fp8LinearMethod",
    "Fp8Scheme",
    "has_fp8_matrix_units",
    "select_path",
]

WEIGHT_STRATEGIES = ("tensor", "channel", "block")
ACTIVATION_STRATEGIES = ("tensor", "token")
FP8_MIN_CAPABILITY = 89
# split-K GEMV up to here (at most engine_fp8.gemv.MAX_TOKENS); 0 (off) when
# engine_sdk.runtime.quant_gemv_enabled() says no (ENGINE_QUANT_GEMV=0).
GEMV_MAX_TOKENS = 16 if quant_gemv_enabled() else 0
GEMV_FMA_MAX_TOKENS = 1  # ... on CUDA cores up to here, tensor cores above (first guess)
W8A16_MAX_TOKENS = 16  # weight-only GEMM up to here when _scaled_mm could run
W8A16_DENSE_MAX_TOKENS = 256  # ... and up to here when the alternative dequantizes
W8A16_FMA_MAX_TOKENS = 4  # CUDA cores up to here, tensor cores above (first guess)
_MIN_GEMV_BLOCK_N = 16  # the narrowest GEMV tile: one split-K counter per 16 columns
_W8A16_DTYPES = (torch.float16, torch.bfloat16)
ROW_GEMV = os.environ.get("ENGINE_FP8_ROW_GEMV", "1") != "0"  # the ``rows`` path (docstring)


def select_path(layer: torch.nn.Module, num_tokens: int, dtype: torch.dtype) -> str:
    """``gemv`` | ``w8a16`` | ``scaled_mm`` | ``reference`` for ``num_tokens`` rows of
    ``dtype`` (see the module docstring)."""
    if getattr(layer, "fp8_w8a16", False) and dtype in _W8A16_DTYPES and num_tokens > 0:
        if num_tokens <= GEMV_MAX_TOKENS:
            return "gemv"
        limit = W8A16_MAX_TOKENS if layer.fp8_use_scaled_mm else W8A16_DENSE_MAX_TOKENS
        if num_tokens <= limit:
            return "w8a16"
    return "scaled_mm" if layer.fp8_use_scaled_mm else "reference"


@dataclass(frozen=True)
class Fp8Scheme:
    """How one model's FP8 linear layers are stored and applied."""

    serialized: bool = False  # weights arrive in fp8 (False: quantize the loaded weights)
    weight_strategy: str = "tensor"
    block: tuple[int, int] | None = None  # for weight_strategy "block"
    block_scale_name: str = "weight_scale_inv"
    activation_scheme: str | None = "dynamic"  # "dynamic", "static" or None (weight-only)
    activation_strategy: str = "tensor"  # for dynamic activations

    def __post_init__(self) -> None:
        if self.weight_strategy not in WEIGHT_STRATEGIES:
            raise ValueError(
                f"fp8 weight strategy {self.weight_strategy!r} is not supported; "
                f"use one of {', '.join(WEIGHT_STRATEGIES)}"
            )
        if (self.weight_strategy == "block") != (self.block is not None):
            raise ValueError("fp8 block weights need a block size [rows, cols] and vice versa")
        if self.activation_scheme not in ("dynamic", "static", None):
            raise ValueError(
                f"fp8 activation_scheme {self.activation_scheme!r} is not supported; "
                "use 'dynamic' or 'static'"
            )
        if self.activation_strategy not in ACTIVATION_STRATEGIES:
            raise ValueError(
                f"fp8 activation strategy {self.activation_strategy!r} is not supported; "
                f"use one of {', '.join(ACTIVATION_STRATEGIES)}"
            )
        if not self.serialized and self.activation_scheme == "static":
            raise ValueError(
                "fp8 activation_scheme 'static' needs calibrated input scales from an fp8 "
                "checkpoint; online quantization (--quantization fp8) uses 'dynamic'"
            )


def has_fp8_matrix_units(device: torch.device) -> bool:
    """True on CUDA GPUs of compute capability 8.9 or newer (Ada, Hopper, Blackwell)."""
    if device.type != "cuda" or not torch.cuda.is_available():
        return False
    major, minor = torch.cuda.get_device_capability(device)
    return major * 10 + minor >= FP8_MIN_CAPABILITY


def _scale_loader(layer_name: str):  # type: ignore[no-untyped-def]
    """Copy a scale whose stored shape may differ only by size-1 dims ([] vs [1], [N] vs
    [N, 1]), which fp8 exporters disagree on."""

    def load(param: torch.nn.Parameter, tensor: torch.Tensor) -> None:
        if tensor.numel() != param.numel():
            raise ValueError(
                f"{layer_name}: scale tensor has shape {tuple(tensor.shape)}, the fp8 layout "
                f"expects {tuple(param.shape)}; is quantization_config's strategy right?"
            )
        param.data.copy_(tensor.reshape(param.shape))

    return load


def _fp8_weight_loader(layer_name: str):  # type: ignore[no-untyped-def]
    def load(param: torch.nn.Parameter, tensor: torch.Tensor) -> None:
        if tensor.dtype != quant_ops.FP8_DTYPE:
            raise ValueError(
                f"{layer_name}.weight is {tensor.dtype} but quantization_config says the "
                "checkpoint stores float8_e4m3fn weights; remove quantization_config from "
                "config.json and pass --quantization fp8 to quantize an unquantized checkpoint"
            )
        if tuple(tensor.shape) != tuple(param.shape):
            raise ValueError(
                f"{layer_name}.weight has shape {tuple(tensor.shape)}, the model expects "
                f"{tuple(param.shape)}"
            )
        param.data.copy_(tensor)

    return load


def _param(tensor: torch.Tensor, loader) -> torch.nn.Parameter:  # type: ignore[no-untyped-def]
    param = torch.nn.Parameter(tensor, requires_grad=False)
    if loader is not None:
        param.weight_loader = loader  # type: ignore[attr-defined]
    return param


class Fp8LinearMethod(QuantizationMethod):
    """FP8 weights for one linear layer (see the module docstring for the layouts)."""

    def __init__(self, scheme: Fp8Scheme) -> None:
        self.scheme = scheme

    # -- parameters -------------------------------------------------------------------

    def create_weights(
        self,
        layer: torch.nn.Module,
        input_size: int,
        output_size: int,
        params_dtype: torch.dtype,
    ) -> None:
        scheme, name = self.scheme, getattr(layer, "prefix", "") or "linear"
        layer.fp8_use_scaled_mm = False
        layer.fp8_triton_quant = False
        layer.fp8_w8a16 = False
        if not scheme.serialized:
            weight = torch.empty(output_size, input_size, dtype=params_dtype)
            layer.register_parameter("weight", _param(weight, None))
            return
        weight = torch.empty(output_size, input_size, dtype=quant_ops.FP8_DTYPE)
        layer.register_parameter("weight", _param(weight, _fp8_weight_loader(name)))
        if scheme.weight_strategy == "tensor":
            scale, scale_name = torch.empty(1, dtype=torch.float32), "weight_scale"
        elif scheme.weight_strategy == "channel":
            scale, scale_name = torch.empty(output_size, 1, dtype=torch.float32), "weight_scale"
        else:
            assert scheme.block is not None
            b0, b1 = scheme.block
            shape = (-(-output_size // b0), -(-input_size // b1))
            scale, scale_name = torch.empty(shape, dtype=torch.float32), scheme.block_scale_name
        layer.register_parameter(scale_name, _param(scale, _scale_loader(name)))
        if scheme.activation_scheme == "static":
            input_scale = torch.empty(1, dtype=torch.float32)
            layer.register_parameter("input_scale", _param(input_scale, _scale_loader(name)))

    def _weight_scale(self, layer: torch.nn.Module) -> torch.Tensor:
        if self.scheme.serialized and self.scheme.weight_strategy == "block":
            scale: torch.Tensor = getattr(layer, self.scheme.block_scale_name)
            return scale
        return layer.weight_scale  # type: ignore[no-any-return]

    def process_weights_after_loading(self, layer: torch.nn.Module) -> None:
        scheme = self.scheme
        if not scheme.serialized:
            weight = layer.weight.data
            if scheme.weight_strategy == "channel":
                qweight, scale = quant_ops.quantize_per_channel(weight)
            else:
                qweight, scale = quant_ops.quantize_per_tensor(weight)
                scale = scale.reshape(1)
            del layer.weight
            layer.register_parameter("weight", _param(qweight, None))
            layer.register_parameter("weight_scale", _param(scale, None))
        num_out, num_in = layer.weight.shape
        layer.fp8_use_scaled_mm = (
            scheme.weight_strategy != "block"
            and scheme.activation_scheme is not None
            and has_fp8_matrix_units(layer.weight.device)
            and num_in % 16 == 0
            and num_out % 16 == 0
        )
        layer.fp8_triton_quant = layer.fp8_use_scaled_mm and triton_available()
        block = self._block()
        layer.fp8_w8a16 = (
            has_fp8_matrix_units(layer.weight.device)
            and triton_available()
            and (block is None or block[1] % 16 == 0)  # the kernel's K steps fit a block
        )
        if layer.fp8_w8a16:
            _add_gemv_locks(layer, num_out, layer.weight.device)

    def _block(self) -> tuple[int, int] | None:
        return self.scheme.block if self.scheme.weight_strategy == "block" else None

    def dequantize_weight(self, layer: torch.nn.Module, dtype: torch.dtype) -> torch.Tensor:
        """The layer's weight as ``dtype`` [out, in] (for references and tests)."""
        return quant_ops.dequantize(layer.weight, self._weight_scale(layer), dtype, self._block())

    # -- matmul -----------------------------------------------------------------------

    def row_gemv_scale(
        self, layer: torch.nn.Module, x: torch.Tensor, residual: torch.Tensor | None = None
    ) -> torch.Tensor | None:
        """The layer's scale as the SDK's row GEMV takes it (float32, one or ``[N, 1]``) when
        that kernel runs this call (the ``rows`` path: ``ENGINE_FP8_ROW_GEMV`` on, an fp8
        weight with a tensor or channel scale, a GPU where the ``gemv`` path runs or
        ``ENGINE_GEMV=force``, and ``gemv.use_gemv`` / ``use_gemv_add_rms_norm`` (with
        ``residual``) for the shapes); else None."""
        if not ROW_GEMV or self._block() is not None:
            return None
        weight = getattr(layer, "weight", None)
        scale = getattr(layer, "weight_scale", None)
        if not isinstance(weight, torch.Tensor) or not isinstance(scale, torch.Tensor):
            return None
        if x.dim() != 2 or row_gemv.weight_scale_mode(weight, scale) not in (1, 2):
            return None
        if x.is_cuda and not getattr(layer, "fp8_w8a16", False):
            return None  # below compute capability 8.9 or without Triton
        if residual is None:
            return scale if row_gemv.use_gemv(x, weight, scale) else None
        return scale if row_gemv.use_gemv_add_rms_norm(x, residual, weight, scale) else None

    def apply_add_rms_norm(
        self,
        layer: torch.nn.Module,
        x: torch.Tensor,
        residual: torch.Tensor,
        norm_weight: torch.Tensor,
        eps: float,
        bias: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor] | None:
        """The decoder's residual add and RMSNorm inside the decode GEMV
        (:func:`engine_fp8.gemv.fp8_gemv_add_rms_norm`) where the call takes the ``gemv``
        path with at most ``NORM_MAX_ROWS`` rows; else None (the decoder's own kernels)."""
        from engine_sdk.layers.split_k import fuses_add_rms_norm

        from engine_fp8.gemv import fp8_gemv_add_rms_norm

        scale = self.row_gemv_scale(layer, x, residual)
        if scale is not None:  # the SDK's row GEMV with the fp8 weight
            return row_gemv.gemv_add_rms_norm(
                x, residual, norm_weight, eps, layer.weight, bias, scale=scale
            )
        if not fuses_add_rms_norm(x, residual, norm_weight):  # [M, K] with M <= NORM_MAX_ROWS
            return None
        if select_path(layer, x.shape[0], x.dtype) != "gemv":
            return None
        return fp8_gemv_add_rms_norm(
            x, residual, norm_weight, eps, layer.weight, self._weight_scale(layer),
            self._block(), bias, None, getattr(layer, "gemv_locks", None),
        )  # fmt: skip

    def apply_add_rms_norm_silu(
        self,
        layer: torch.nn.Module,
        x: torch.Tensor,
        residual: torch.Tensor,
        norm_weight: torch.Tensor,
        eps: float,
        bias: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor] | None:
        """The SDK's gated row GEMV (norm, merged gate/up and SiLU-and-mul in one launch)
        with the fp8 weight, where :func:`row_gemv_scale` allows it; else None."""
        scale = self.row_gemv_scale(layer, x, residual)
        if scale is None or layer.weight.shape[0] % 2:
            return None
        return row_gemv.gemv_add_rms_norm(
            x, residual, norm_weight, eps, layer.weight, bias, gated=True, scale=scale
        )

    def apply(
        self, layer: torch.nn.Module, x: torch.Tensor, bias: torch.Tensor | None = None
    ) -> torch.Tensor:
        x2 = x.reshape(-1, x.shape[-1])
        scale = self.row_gemv_scale(layer, x2)
        if scale is not None:
            out = row_gemv.gemv(x2, layer.weight, bias, scale=scale)
            return out.reshape(*x.shape[:-1], out.shape[-1])
        path = select_path(layer, x2.shape[0], x.dtype)
        if path == "gemv":
            from engine_fp8.gemv import fp8_gemv

            x2 = x2 if x2.stride(-1) == 1 else x2.contiguous()
            out = fp8_gemv(
                x2, layer.weight, self._weight_scale(layer), self._block(), bias, None,
                getattr(layer, "gemv_locks", None),  # None: zeroed per call (a memset)
            )  # fmt: skip
            return out.reshape(*x.shape[:-1], out.shape[-1])
        if path == "w8a16":
            from engine_fp8 import w8a16

            x2 = x2 if x2.stride(-1) == 1 else x2.contiguous()
            num_tokens, block = x2.shape[0], self._block()
            variant = "fma" if num_tokens <= W8A16_FMA_MAX_TOKENS else "dot"
            config = w8a16.default_config(num_tokens, layer.weight.shape[0], variant, block)
            out = w8a16.fp8_w8a16_gemm(
                x2, layer.weight, self._weight_scale(layer), block, bias, config
            )
            return out.reshape(*x.shape[:-1], out.shape[-1])
        if path == "reference":
            return quant_ops.fp8_linear_reference(
                x, layer.weight, self._weight_scale(layer), bias, self._block()
            )
        static = self.scheme.activation_scheme == "static"
        if layer.fp8_triton_quant:
            from engine_fp8 import triton_quant

            strategy = "static" if static else self.scheme.activation_strategy
            # Next to per-channel weight scales _scaled_mm wants one activation scale per
            # row; the kernel writes them (no copy of a repeated scalar per call).
            row_scales = layer.weight_scale.numel() > 1
            input_scale = layer.input_scale if static else None
            qx, x_scale = triton_quant.quantize(x2, strategy, input_scale, row_scales)
        elif static:
            x_scale = layer.input_scale
            qx = quant_ops.quantize_with_scale(x2, x_scale)
        elif self.scheme.activation_strategy == "token":
            qx, x_scale = quant_ops.quantize_per_token(x2)
        else:
            qx, x_scale = quant_ops.quantize_per_tensor(x2)
        out = quant_ops.scaled_mm(qx, x_scale, layer.weight, layer.weight_scale, x.dtype, bias)
        return out.reshape(*x.shape[:-1], out.shape[-1])

    # -- merging ----------------------------------------------------------------------

    def merge(
        self, layers: Sequence[torch.nn.Module], merged: torch.nn.Module
    ) -> QuantizationMethod | None:
        """Concatenate the fp8 weights; scales become per channel (see the module
        docstring). ``None`` when the layers' schemes, devices or paths differ, static input
        scales differ, or block scales do not tile the merged weight."""
        scheme = self.scheme
        methods = [layer.quant_method for layer in layers]
        if any(not isinstance(m, Fp8LinearMethod) or m.scheme != scheme for m in methods):
            return None
        weights: list[torch.Tensor] = [layer.weight for layer in layers]
        if len({(w.dtype, w.device) for w in weights}) != 1:
            return None
        if weights[0].dtype != quant_ops.FP8_DTYPE:
            return None  # not processed yet (online weights are quantized after loading)
        paths = {(bool(layer.fp8_use_scaled_mm), bool(layer.fp8_w8a16)) for layer in layers}
        if len(paths) != 1:
            return None
        if scheme.activation_scheme == "static":
            first_scale = layers[0].input_scale
            if not all(torch.equal(layer.input_scale, first_scale) for layer in layers):
                return None
        scale_name = "weight_scale"
        if scheme.weight_strategy == "block":
            assert scheme.block is not None
            if any(layer.weight.shape[0] % scheme.block[0] for layer in layers[:-1]):
                return None  # a partial tile row would shift every later layer's tiles
            scale_name = scheme.block_scale_name
            scales = [self._weight_scale(layer).data for layer in layers]
            merged_scheme = scheme
        else:
            scales = [_channel_scale(layer) for layer in layers]
            merged_scheme = replace(scheme, weight_strategy="channel")
        weight = torch.cat([w.data for w in weights], dim=0)
        merged.register_parameter("weight", _param(weight, None))
        merged.register_parameter(scale_name, _param(torch.cat(scales, dim=0), None))
        if scheme.activation_scheme == "static":
            input_scale = layers[0].input_scale.data.clone()
            merged.register_parameter("input_scale", _param(input_scale, None))
        merged.fp8_use_scaled_mm = layers[0].fp8_use_scaled_mm
        merged.fp8_triton_quant = layers[0].fp8_triton_quant
        merged.fp8_w8a16 = layers[0].fp8_w8a16
        if merged.fp8_w8a16:
            _add_gemv_locks(merged, weight.shape[0], weight.device)
        share_merged(layers, "weight", weight)
        return Fp8LinearMethod(merged_scheme)


def _add_gemv_locks(layer: torch.nn.Module, num_out: int, device: torch.device) -> None:
    """The layer's split-K counters for the GEMV (:mod:`engine_fp8.gemv`): one per output
    tile of the narrowest tile, zero between calls."""
    from engine_sdk.layers.split_k import split_k_locks

    locks = split_k_locks(-(-num_out // _MIN_GEMV_BLOCK_N), device)
    layer.register_buffer("gemv_locks", locks, persistent=False)


def _channel_scale(layer: torch.nn.Module) -> torch.Tensor:
    """The layer's weight scale as float32 [out, 1] (a per-tensor scale repeated)."""
    scale: torch.Tensor = layer.weight_scale.data.float()
    num_out = layer.weight.shape[0]
    if scale.numel() == 1:
        return scale.reshape(1, 1).expand(num_out, 1)
    return scale.reshape(num_out, 1)
