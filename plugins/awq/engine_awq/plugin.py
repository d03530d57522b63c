"""Entry point: declares the ``awq`` quantization method (no torch or triton import)."""

from __future__ import annotations

from engine_sdk import QuantizationMethodSpec, hookimpl


@hookimpl
def register_quantization_methods() -> list[QuantizationMethodSpec]:
    return [
        QuantizationMethodSpec(
            name="awq",
            target="engine_awq.config:AwqConfig",
            description="AutoAWQ GEMM 4-bit checkpoints (Triton dequantize-GEMM on CUDA)",
            devices=("cuda",),
            min_capability=75,
            reference_devices=("cpu",),
        )
    ]
