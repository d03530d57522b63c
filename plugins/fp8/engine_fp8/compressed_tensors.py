"""``quant_method: compressed-tensors`` checkpoints whose weights are float8 (llm-compressor).

The config (``config.json`` ``quantization_config``) looks like::

    {"quant_method": "compressed-tensors", "format": "float-quantized",
     "config_groups": {"group_0": {
         "targets": ["Linear"],
         "weights": {"num_bits": 8, "type": "float", "strategy": "tensor" | "channel"
                     | "block", "block_structure": [128, 128], "symmetric": true,
                     "dynamic": false},
         "input_activations": {"num_bits": 8, "type": "float", "dynamic": true,
                               "strategy": "token" | "tensor"}   # or null: weight-only
     }},
     "ignore": ["lm_head", "re:.*mlp.gate$"]}

Tensors per layer: ``weight`` float8_e4m3fn [out, in]; ``weight_scale`` float32 with shape
[1] (tensor), [out, 1] (channel) or [ceil(out/b0), ceil(in/b1)] (block); ``input_scale`` [1]
when ``input_activations.dynamic`` is false (static). Integer schemes (W4A16, W8A8-int8)
and packed formats are not supported here and fail with the value that was found.
"""

from __future__ import annotations

import re
from typing import Any

import torch
from engine_sdk.interfaces.quantization import QuantizationConfig, QuantizationMethod

from engine_fp8.device import fp8_device_problem
from engine_fp8.method import Fp8LinearMethod, Fp8Scheme

__all__ = ["CompressedTensorsConfig"]

_FORMATS = ("float-quantized", "naive-quantized")
_NAME = "compressed-tensors"


def _matches(prefix: str, target: str) -> bool:
    if target.startswith("re:"):
        return re.match(target[3:], prefix) is not None
    return prefix == target or prefix.endswith("." + target)


def _weights_scheme(group_name: str, weights: Any) -> tuple[str, tuple[int, int] | None]:
    where = f"compressed-tensors config_groups[{group_name!r}].weights"
    if not isinstance(weights, dict):
        raise ValueError(f"{where} is missing; a float8 scheme needs a weights entry")
    num_bits, kind = weights.get("num_bits"), weights.get("type")
    if num_bits != 8 or kind != "float":
        raise ValueError(
            f"{where} has num_bits={num_bits!r}, type={kind!r}; engine-fp8 reads float8 "
            "weights only (num_bits 8, type 'float'); use a float8 checkpoint"
        )
    if weights.get("symmetric", True) is not True:
        raise ValueError(f"{where}.symmetric is false; float8 weights must be symmetric")
    strategy = weights.get("strategy", "tensor")
    if strategy == "block":
        block = weights.get("block_structure")
        if isinstance(block, str):  # older exports wrote "128x128"
            block = [int(v) for v in block.lower().split("x")]
        if not isinstance(block, list | tuple) or len(block) != 2:
            raise ValueError(f"{where}.block_structure is {block!r}; expected [rows, cols]")
        return "block", (int(block[0]), int(block[1]))
    if strategy not in ("tensor", "channel"):
        raise ValueError(
            f"{where}.strategy is {strategy!r}; supported: 'tensor', 'channel', 'block'"
        )
    return str(strategy), None


def _activation_scheme(group_name: str, acts: Any) -> tuple[str | None, str]:
    if acts is None:
        return None, "tensor"
    where = f"compressed-tensors config_groups[{group_name!r}].input_activations"
    if acts.get("num_bits") != 8 or acts.get("type") != "float":
        raise ValueError(
            f"{where} has num_bits={acts.get('num_bits')!r}, type={acts.get('type')!r}; "
            "only float8 activations (or none) are supported"
        )
    strategy = acts.get("strategy", "tensor")
    if acts.get("dynamic", False):
        if strategy not in ("tensor", "token"):
            raise ValueError(f"{where}.strategy is {strategy!r}; use 'token' or 'tensor'")
        return "dynamic", str(strategy)
    if strategy != "tensor":
        raise ValueError(f"{where}: static activations need strategy 'tensor', got {strategy!r}")
    return "static", "tensor"


def _scheme_of_group(group_name: str, group: dict[str, Any]) -> Fp8Scheme:
    weight_strategy, block = _weights_scheme(group_name, group.get("weights"))
    activation, activation_strategy = _activation_scheme(group_name, group.get("input_activations"))
    return Fp8Scheme(
        serialized=True,
        weight_strategy=weight_strategy,
        block=block,
        block_scale_name="weight_scale",
        activation_scheme=activation,
        activation_strategy=activation_strategy,
    )


class CompressedTensorsConfig(QuantizationConfig):
    """float8 compressed-tensors checkpoints (see the module docstring for the layout)."""

    name = _NAME

    def __init__(
        self,
        groups: list[tuple[list[str], Fp8Scheme]],
        ignore: list[str],
        allow_reference: bool = False,
    ) -> None:
        self.groups = groups
        self.ignore = ignore
        self.allow_reference = allow_reference

    @classmethod
    def from_config(cls, config: dict[str, Any]) -> CompressedTensorsConfig:
        fmt = config.get("format")
        if fmt is not None and fmt not in _FORMATS:
            raise ValueError(
                f"compressed-tensors format {fmt!r} is not supported; engine-fp8 reads "
                f"{' and '.join(_FORMATS)} float8 checkpoints"
            )
        raw_groups = config.get("config_groups")
        if not isinstance(raw_groups, dict) or not raw_groups:
            raise ValueError(
                "compressed-tensors quantization_config has no config_groups; the checkpoint "
                "must say which layers are quantized and how"
            )
        groups = []
        for group_name, group in raw_groups.items():
            targets = group.get("targets") or ["Linear"]
            groups.append((list(targets), _scheme_of_group(group_name, group)))
        ignore = list(config.get("ignore") or [])
        return cls(groups, ignore, bool(config.get("allow_reference", False)))

    def get_method(self, prefix: str) -> QuantizationMethod | None:
        if any(_matches(prefix, name) for name in self.ignore):
            return None
        for targets, scheme in self.groups:
            if "Linear" in targets or any(_matches(prefix, t) for t in targets):
                return Fp8LinearMethod(scheme)
        return None

    def check_device(self, device: torch.device) -> str | None:
        return fp8_device_problem(device, _NAME, self.allow_reference)
