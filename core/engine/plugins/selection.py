"""Choosing an attention backend from the declared capabilities of the registered ones.

Every rejected candidate gets a reason, so "no backend fits" says exactly what to change.
"""

from __future__ import annotations

from engine_sdk.specs import AttentionBackendSpec


def normalize_device(device: object) -> str:
    """``"cuda:0"`` / ``torch.device("cuda", 0)`` -> ``"cuda"``."""
    return str(device).split(":")[0].strip().lower()


def normalize_dtype(dtype: object) -> str:
    """``torch.float16`` / ``"torch.float16"`` / ``"float16"`` -> ``"float16"``."""
    text = str(dtype).strip().lower()
    text = text.removeprefix("torch.")
    return {"half": "float16", "float": "float32", "bf16": "bfloat16", "fp16": "float16"}.get(
        text, text
    )


def misfit(spec: AttentionBackendSpec, device: str, dtype: str, block_size: int) -> str | None:
    """Why ``spec`` cannot serve this configuration, or ``None`` when it can."""
    reasons = []
    if device not in spec.devices:
        reasons.append(f"device {device!r} not in {list(spec.devices)}")
    if dtype not in spec.dtypes:
        reasons.append(f"dtype {dtype!r} not in {list(spec.dtypes)}")
    if block_size not in spec.block_sizes:
        reasons.append(f"block size {block_size} not in {list(spec.block_sizes)}")
    return "; ".join(reasons) or None


def rank_backends(
    specs: list[AttentionBackendSpec], device: str, dtype: str, block_size: int
) -> tuple[list[AttentionBackendSpec], dict[str, str]]:
    """Fitting specs (highest priority first, then by name) and ``{name: why not}``."""
    fitting: list[AttentionBackendSpec] = []
    rejected: dict[str, str] = {}
    for spec in specs:
        reason = misfit(spec, device, dtype, block_size)
        if reason is None:
            fitting.append(spec)
        else:
            rejected[spec.name] = reason
    fitting.sort(key=lambda s: (-s.priority, s.name))
    return fitting, rejected
