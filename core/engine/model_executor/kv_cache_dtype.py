"""``--kv-cache-dtype``: the torch dtype of the KV cache tensors.

``auto`` keeps the model dtype. ``fp8`` (= ``fp8_e4m3``, ``torch.float8_e4m3fn``) and
``fp8_e5m2`` store one byte per element with per-layer K/V scales (see
``engine_sdk.interfaces.attention``). A backend declares the values it stores in its spec's
``kv_cache_dtypes``; the plugin manager checks that with the backend's other capabilities
(``engine.plugins.capabilities``) when it chooses the backend.
"""

from __future__ import annotations

import torch
from engine_sdk.interfaces.attention import FP8_KV_CACHE_DTYPES

from engine.errors import StartupError

__all__ = ["resolve_kv_cache_dtype", "valid_kv_cache_dtypes"]


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
