"""What the running machine offers, for plugins choosing a code path at load time."""

from __future__ import annotations

__all__ = ["triton_available"]


def triton_available() -> bool:
    """Whether Triton imports here (kernels can be compiled; CPU-only installs lack it)."""
    try:
        import triton  # noqa: F401
    except ImportError:
        return False
    return True
