"""What the running machine offers, for plugins choosing a code path at load time."""

from __future__ import annotations

import os

__all__ = ["quant_gemv_enabled", "triton_available"]


def triton_available() -> bool:
    """Whether Triton imports here (kernels can be compiled; CPU-only installs lack it)."""
    try:
        import triton  # noqa: F401
    except ImportError:
        return False
    return True


def quant_gemv_enabled() -> bool:
    """Whether the quantization plugins' split-K decode GEMVs are on: yes unless
    ``ENGINE_QUANT_GEMV=0`` (which keeps decode batches on the older W4A16 / W8A16 GEMMs,
    for comparisons). Read when a plugin's method module loads."""
    return os.environ.get("ENGINE_QUANT_GEMV", "1") != "0"
