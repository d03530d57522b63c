"""Can this device run FP8 linear layers? Shared by the fp8 and compressed-tensors configs."""

from __future__ import annotations

import torch

from engine_fp8.method import FP8_MIN_CAPABILITY, has_fp8_matrix_units

__all__ = ["fp8_device_problem"]


def fp8_device_problem(device: torch.device, name: str, allow_reference: bool) -> str | None:
    """``None`` when ``device`` runs ``name``'s FP8 layers, else the reason and the fix.

    CPUs run the dequantize-then-matmul reference. CUDA GPUs need FP8 matrix units
    (compute capability >= 8.9) unless the checkpoint's quantization_config sets
    ``"allow_reference": true``, which dequantizes on the GPU instead (correct, slower).
    """
    if device.type == "cpu":
        return None
    if device.type != "cuda":
        return f"{name} runs on CUDA GPUs (capability >= 8.9) and on the CPU, not on {device}"
    if allow_reference or has_fp8_matrix_units(device):
        return None
    major, minor = torch.cuda.get_device_capability(device)
    return (
        f"{name} needs FP8 matrix units (CUDA compute capability >= "
        f"{FP8_MIN_CAPABILITY // 10}.{FP8_MIN_CAPABILITY % 10}: Ada, Hopper or newer) and this "
        f"GPU is {major}.{minor}. Use --device cpu for the slower reference path, set "
        '"allow_reference": true in quantization_config to dequantize on this GPU, or load '
        "an unquantized checkpoint"
    )
