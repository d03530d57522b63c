"""Rope parameters of a GGUF model, in transformers' ``rope_parameters`` form.

llama.cpp stores rope scaling two ways: metadata keys (``{arch}.rope.scaling.type`` /
``factor`` / ``original_context_length``, for linear and yarn) or, for Llama 3.1+, a
``rope_freqs.weight`` tensor holding one divisor per rotary frequency. The divisors follow
Llama 3's piecewise rule, so its parameters are recovered from them and checked by
recomputing every divisor:

    wavelen < L / high_freq_factor   -> 1                      (high frequencies kept)
    wavelen > L / low_freq_factor    -> factor                 (low frequencies scaled)
    otherwise                        -> 1 / ((1 - s) / factor + s),
                                        s = (L / wavelen - low) / (high - low)
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

# Llama 3.1 / 3.2 / 3.3 all used these; the tensor does not record L itself.
LLAMA3_ORIGINAL_CONTEXT = 8192
_LLAMA3_DEFAULT_LOW_HIGH = (1.0, 4.0)


def tidy_float(value: float) -> float:
    """A float32 metadata value as its shortest decimal (9.9999997e-06 -> 1e-05)."""
    return float(str(np.float32(value)))


def rope_parameters_from_metadata(
    scaling_type: str | None,
    rope_theta: float,
    factor: float | None,
    original_context: int | None,
    beta_fast: float | None = None,
    beta_slow: float | None = None,
) -> dict[str, Any]:
    """``rope_parameters`` for the metadata-keyed scalings (none, linear, yarn)."""
    params: dict[str, Any] = {"rope_theta": rope_theta}
    if scaling_type in (None, "", "none") or (scaling_type == "linear" and factor in (None, 1.0)):
        params["rope_type"] = "default"
        return params
    if factor is None:
        raise ValueError(
            f"GGUF rope.scaling.type is {scaling_type!r} but rope.scaling.factor is missing"
        )
    if scaling_type == "linear":
        params.update(rope_type="linear", factor=factor)
    elif scaling_type == "yarn":
        params.update(rope_type="yarn", factor=factor)
        if original_context is not None:
            params["original_max_position_embeddings"] = int(original_context)
        if beta_fast is not None:
            params["beta_fast"] = beta_fast
        if beta_slow is not None:
            params["beta_slow"] = beta_slow
    else:
        raise ValueError(
            f"GGUF rope.scaling.type {scaling_type!r} is not supported by the gguf plugin "
            "(supported: none, linear, yarn, and Llama 3 rope_freqs)"
        )
    return params


def llama3_divisors(
    head_dim: int, rope_theta: float, factor: float, low: float, high: float, context: int
) -> np.ndarray:
    """The per-frequency divisors llama.cpp's converter writes for Llama 3 rope scaling."""
    freqs = 1.0 / (rope_theta ** (np.arange(0, head_dim, 2, dtype=np.float64) / head_dim))
    wavelen = 2 * math.pi / freqs
    smooth = (context / wavelen - low) / (high - low)
    mid = 1.0 / ((1 - smooth) / factor + smooth)
    return np.where(wavelen < context / high, 1.0, np.where(wavelen > context / low, factor, mid))


def llama3_rope_parameters(
    divisors: np.ndarray, head_dim: int, rope_theta: float
) -> dict[str, Any]:
    """Recover ``rope_type: llama3`` parameters from a ``rope_freqs.weight`` tensor."""
    divisors = np.asarray(divisors, dtype=np.float64).reshape(-1)
    if divisors.shape[0] != head_dim // 2:
        raise ValueError(
            f"GGUF rope_freqs.weight has {divisors.shape[0]} entries; expected head_dim/2 = "
            f"{head_dim // 2}"
        )
    factor = float(divisors.max())
    context = LLAMA3_ORIGINAL_CONTEXT
    low, high = _fit_low_high(divisors, factor, head_dim, rope_theta, context)
    expected = llama3_divisors(head_dim, rope_theta, factor, low, high, context)
    if not np.allclose(expected, divisors, rtol=1e-3, atol=1e-4):
        raise ValueError(
            "GGUF rope_freqs.weight does not follow Llama 3 rope scaling with "
            f"original context {context}; the gguf plugin cannot map it to transformers"
        )
    return {
        "rope_type": "llama3",
        "rope_theta": rope_theta,
        "factor": tidy_float(factor),
        "low_freq_factor": round(low, 4),
        "high_freq_factor": round(high, 4),
        "original_max_position_embeddings": context,
    }


def _fit_low_high(
    divisors: np.ndarray, factor: float, head_dim: int, rope_theta: float, context: int
) -> tuple[float, float]:
    # In the smooth band s is linear in L / wavelen: s = (x - low) / (high - low).
    if factor <= 1.0:
        return _LLAMA3_DEFAULT_LOW_HIGH
    mid = (divisors > 1.0 + 1e-4) & (divisors < factor - 1e-4)
    if mid.sum() < 2:
        return _LLAMA3_DEFAULT_LOW_HIGH
    freqs = 1.0 / (rope_theta ** (np.arange(0, head_dim, 2, dtype=np.float64) / head_dim))
    x = context * freqs[mid] / (2 * math.pi)
    s = (1.0 / divisors[mid] - 1.0 / factor) / (1.0 - 1.0 / factor)
    slope, intercept = np.polyfit(x, s, 1)
    low = -intercept / slope
    return float(low), float(low + 1.0 / slope)
