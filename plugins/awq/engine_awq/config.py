"""``quant_method: awq``: AutoAWQ GEMM checkpoints (4-bit, zero points, grouped scales).

The checkpoint's ``quantization_config``::

    {"quant_method": "awq", "bits": 4, "group_size": 128, "zero_point": true,
     "version": "gemm", "modules_to_not_convert": null | ["visual", ...]}

(AutoAWQ's older names ``w_bit`` / ``q_group_size`` are read too.) Only what the GEMM layout
stores is accepted: other bit widths, the GEMV / Marlin / exllama layouts and symmetric
(``zero_point: false``) checkpoints fail with the value that was found.
"""

from __future__ import annotations

from typing import Any

import torch
from engine_sdk.interfaces.quantization import QuantizationConfig, QuantizationMethod
from engine_sdk.runtime import triton_available

from engine_awq.method import AwqLinearMethod

__all__ = ["AwqConfig"]


def _skipped(prefix: str, names: list[str]) -> bool:
    return any(
        prefix == n or prefix.startswith(n + ".") or prefix.endswith("." + n) or f".{n}." in prefix
        for n in names
    )


class AwqConfig(QuantizationConfig):
    """AutoAWQ GEMM 4-bit weights."""

    name = "awq"

    def __init__(self, group_size: int, modules_to_not_convert: list[str] | None = None) -> None:
        self.bits = 4
        self.group_size = group_size
        self.modules_to_not_convert = list(modules_to_not_convert or [])

    @classmethod
    def from_config(cls, config: dict[str, Any]) -> AwqConfig:
        if not config:
            raise ValueError(
                "awq needs an AutoAWQ checkpoint (its config.json quantization_config); "
                "--quantization awq cannot quantize an unquantized model online"
            )
        bits = config.get("bits", config.get("w_bit", 4))
        if bits != 4:
            raise ValueError(f"awq bits={bits!r} is not supported; only 4-bit AWQ is")
        version = str(config.get("version", "gemm")).lower()
        if version != "gemm":
            raise ValueError(
                f"awq version={version!r} is not supported; only the 'gemm' packing is "
                "(re-export the model with AutoAWQ version='gemm')"
            )
        if config.get("zero_point", True) is not True:
            raise ValueError(
                f"awq zero_point={config.get('zero_point')!r} is not supported; the GEMM layout "
                "needs zero points (zero_point: true)"
            )
        group_size = config.get("group_size", config.get("q_group_size", 128))
        if not isinstance(group_size, int) or (group_size <= 0 and group_size != -1):
            raise ValueError(
                f"awq group_size={group_size!r} must be a positive integer (or -1 for one group)"
            )
        skip = config.get("modules_to_not_convert") or []
        if not isinstance(skip, list):
            raise ValueError("awq modules_to_not_convert must be a list of module names")
        return cls(group_size, skip)

    def get_method(self, prefix: str) -> QuantizationMethod | None:
        if _skipped(prefix, self.modules_to_not_convert):
            return None
        return AwqLinearMethod(self.group_size)

    def check_device(self, device: torch.device) -> str | None:
        """The core checked the spec's devices and min_capability; Triton it cannot see."""
        if device.type == "cuda" and not triton_available():
            return "awq on CUDA needs Triton for its kernel; pip install triton"
        return None
