"""Entry point: declares the ``fp8`` and ``compressed-tensors`` methods (no torch import)."""

from __future__ import annotations

from engine_sdk import QuantizationMethodSpec, hookimpl


@hookimpl
def register_quantization_methods() -> list[QuantizationMethodSpec]:
    return [
        QuantizationMethodSpec(
            name="fp8",
            target="engine_fp8.config:Fp8Config",
            description="FP8 e4m3 weights: online from bf16/fp16/fp32, or fp8 checkpoints",
            devices=("cuda",),
            min_capability=89,
            reference_devices=("cpu",),
        ),
        QuantizationMethodSpec(
            name="compressed-tensors",
            target="engine_fp8.compressed_tensors:CompressedTensorsConfig",
            description="compressed-tensors float8 checkpoints (tensor/channel/block scales)",
            devices=("cuda",),
            min_capability=89,
            reference_devices=("cpu",),
        ),
    ]
