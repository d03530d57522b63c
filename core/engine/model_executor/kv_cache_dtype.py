"""``--kv-cache-dtype``: the cache's torch dtype, and an attention backend that can store it.

``auto`` keeps the model dtype. ``fp8`` (= ``fp8_e4m3``, ``torch.float8_e4m3fn``) and
``fp8_e5m2`` store one byte per element with per-layer K/V scales (see
``engine_sdk.interfaces.attention``). A backend declares the values it stores in its spec's
``kv_cache_dtypes``; selection by device, dtype and block size is the plugin manager's, this
module only narrows it to backends that declare the requested cache dtype.
"""

from __future__ import annotations

from typing import Any

import torch
from engine_sdk.interfaces.attention import FP8_KV_CACHE_DTYPES
from engine_sdk.specs import AttentionBackendSpec

from engine.errors import StartupError

__all__ = ["resolve_kv_cache_dtype", "select_backend_for_kv_cache_dtype", "spec_stores"]

_ALIASES = {"fp8": "fp8_e4m3", "fp8_e4m3": "fp8"}


def valid_kv_cache_dtypes() -> list[str]:
    return ["auto", *FP8_KV_CACHE_DTYPES]


def resolve_kv_cache_dtype(name: str, model_dtype: torch.dtype) -> torch.dtype:
    """The cache tensors' dtype for ``--kv-cache-dtype name``."""
    if name == "auto":
        return model_dtype
    if name not in FP8_KV_CACHE_DTYPES:
        raise StartupError(
            f"--kv-cache-dtype {name!r} is not supported; valid values: "
            f"{', '.join(valid_kv_cache_dtypes())} (auto keeps the model dtype, fp8 halves "
            "the KV cache of a 16-bit model)"
        )
    dtype: torch.dtype = getattr(torch, FP8_KV_CACHE_DTYPES[name])
    return dtype


def spec_stores(spec: AttentionBackendSpec, kv_cache_dtype: str) -> bool:
    """Whether the backend declares ``kv_cache_dtype`` (``fp8`` and ``fp8_e4m3`` are one)."""
    declared = set(spec.kv_cache_dtypes)
    return kv_cache_dtype in declared or _ALIASES.get(kv_cache_dtype) in declared


def select_backend_for_kv_cache_dtype(
    pm: Any, device: str, dtype: str, block_size: int, name: str | None, kv_cache_dtype: str
) -> str | None:
    """The backend name to ask the plugin manager for; ``None`` leaves its choice alone.

    With a non-``auto`` cache dtype, a named backend must declare it, and automatic selection
    takes the highest-priority fitting backend that does; otherwise a ``StartupError`` names
    the backends that store it.
    """
    registry = getattr(pm, "registry", None)
    if kv_cache_dtype == "auto" or registry is None:
        return name
    from engine.plugins.selection import normalize_device, normalize_dtype, rank_backends

    specs = [s for s in registry.specs("attention_backend") if isinstance(s, AttentionBackendSpec)]
    storing = [s.name for s in specs if spec_stores(s, kv_cache_dtype)]
    hint = f"backends that store it: {', '.join(storing)}" if storing else "no loaded backend does"
    if name is not None:
        spec = next((s for s in specs if s.name == name), None)
        if spec is None or spec_stores(spec, kv_cache_dtype):
            return name  # unknown names get the plugin manager's error
        raise StartupError(
            f"attention backend {name!r} cannot store --kv-cache-dtype {kv_cache_dtype} "
            f"(it declares {', '.join(spec.kv_cache_dtypes)}); {hint}. Change "
            "--attention-backend or use --kv-cache-dtype auto"
        )
    fitting, _ = rank_backends(specs, normalize_device(device), normalize_dtype(dtype), block_size)
    for spec in fitting:
        if spec_stores(spec, kv_cache_dtype):
            return spec.name
    if not fitting:
        return None  # the plugin manager explains why nothing fits
    raise StartupError(
        f"no attention backend that fits device={normalize_device(device)}, "
        f"dtype={normalize_dtype(dtype)}, block_size={block_size} stores --kv-cache-dtype "
        f"{kv_cache_dtype} (fitting: {', '.join(s.name for s in fitting)}; {hint}). Use "
        "--kv-cache-dtype auto, or change --attention-backend / --dtype / --block-size"
    )
