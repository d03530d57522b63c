"""``quant_method: fp8``: online FP8 quantization and checkpoints stored in the fp8 layout.

Online (``--quantization fp8`` on a bf16/fp16/fp32 checkpoint; the dict is ``{}``): every
linear weight is quantized to float8_e4m3fn after loading, one scale per tensor by default.
Options (keys of the same dict, for programmatic use): ``weight_strategy`` ``tensor`` |
``channel``; ``activation_strategy`` ``tensor`` | ``token`` (dynamic activation scales).

Serialized (the checkpoint's ``quantization_config`` says ``"quant_method": "fp8"``)::

    {"quant_method": "fp8", "activation_scheme": "dynamic" | "static",
     "weight_block_size": [128, 128]            # optional: block-wise scales
     "ignored_layers" / "modules_to_not_convert": [...]}   # optional: kept unquantized

Tensors per layer: ``weight`` float8_e4m3fn [out, in] and either ``weight_scale`` (float32,
one per tensor) or, with ``weight_block_size``, ``weight_scale_inv`` float32
[ceil(out/b0), ceil(in/b1)]; ``input_scale`` (float32 scalar) when activations are static.
The dequantized weight is ``weight * scale`` in both cases.
"""

from __future__ import annotations

from typing import Any

import torch
from engine_sdk.interfaces.quantization import QuantizationConfig, QuantizationMethod

from engine_fp8.device import fp8_device_problem
from engine_fp8.method import Fp8LinearMethod, Fp8Scheme

__all__ = ["Fp8Config", "is_layer_skipped"]


def is_layer_skipped(prefix: str, names: list[str]) -> bool:
    """``prefix`` (``model.layers.0.mlp.down_proj``) matches an entry exactly, or the entry
    names a dotted part of it (``lm_head``, ``mlp.down_proj``, ``model.layers.0``)."""
    for name in names:
        if prefix == name or prefix.endswith("." + name) or prefix.startswith(name + "."):
            return True
    return False


def _str_list(config: dict[str, Any], key: str) -> list[str]:
    value = config.get(key) or []
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise ValueError(f"fp8 quantization_config[{key!r}] must be a list of module names")
    return list(value)


def _block_size(value: Any) -> tuple[int, int] | None:
    if value is None:
        return None
    if (
        not isinstance(value, list | tuple)
        or len(value) != 2
        or not all(isinstance(v, int) and v > 0 for v in value)
    ):
        raise ValueError(
            f"fp8 quantization_config['weight_block_size'] is {value!r}; it must be two "
            "positive integers [rows, cols] such as [128, 128]"
        )
    return int(value[0]), int(value[1])


class Fp8Config(QuantizationConfig):
    """FP8 e4m3 weights, online or from an fp8-layout checkpoint (see module docstring)."""

    name = "fp8"

    def __init__(
        self,
        scheme: Fp8Scheme,
        ignored_layers: list[str] | None = None,
        allow_reference: bool = False,
    ) -> None:
        self.scheme = scheme
        self.ignored_layers = list(ignored_layers or [])
        self.allow_reference = allow_reference

    @classmethod
    def from_config(cls, config: dict[str, Any]) -> Fp8Config:
        serialized = config.get("quant_method") == "fp8"
        fmt = config.get("fmt", "e4m3")
        if fmt != "e4m3":
            raise ValueError(f"fp8 quantization_config['fmt'] is {fmt!r}; only 'e4m3' is supported")
        block = _block_size(config.get("weight_block_size"))
        if block is not None and not serialized:
            raise ValueError(
                "fp8 weight_block_size needs an fp8 checkpoint; online quantization uses "
                "weight_strategy 'tensor' or 'channel'"
            )
        activation = config.get("activation_scheme", "dynamic")
        default_weights = "tensor" if block is None else "block"
        scheme = Fp8Scheme(
            serialized=serialized,
            weight_strategy=str(config.get("weight_strategy", default_weights)),
            block=block,
            activation_scheme=activation,
            activation_strategy=str(config.get("activation_strategy", "tensor")),
        )
        if serialized and scheme.weight_strategy == "channel":
            raise ValueError(
                "fp8 checkpoints store one weight_scale per tensor (or per block with "
                "weight_block_size); per-channel fp8 checkpoints use quant_method "
                "'compressed-tensors'"
            )
        ignored = _str_list(config, "ignored_layers") + _str_list(config, "modules_to_not_convert")
        return cls(scheme, ignored, bool(config.get("allow_reference", False)))

    def get_method(self, prefix: str) -> QuantizationMethod | None:
        if is_layer_skipped(prefix, self.ignored_layers):
            return None
        return Fp8LinearMethod(self.scheme)

    def check_device(self, device: torch.device) -> str | None:
        return fp8_device_problem(device, "fp8", self.allow_reference)
