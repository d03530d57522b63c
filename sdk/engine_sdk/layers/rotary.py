"""Rotary position embedding with the Hugging Face rope types (default, linear, llama3, yarn,
longrope).

Frequencies are computed exactly as ``transformers.modeling_rope_utils`` does, and cos/sin
are computed per step from the positions in float32, then cast to the activation dtype, as
HF's rotary modules do, so float32 runs match HF bit for bit and bf16 runs round the same.

Rotation is the "rotate half" (GPT-NeoX) layout Llama and Qwen checkpoints use::

    x = [x1 | x2]            (each head_dim / 2 wide; only the first rotary_dim dims rotate)
    out = x * cos + [-x2 | x1] * sin
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import torch

from engine_sdk.layers import fused_ops

__all__ = [
    "RopeParameters",
    "RotaryEmbedding",
    "apply_rotary",
    "compute_inv_freq",
    "rope_parameters_from_config",
]

SUPPORTED_ROPE_TYPES = ("default", "linear", "llama3", "yarn", "dynamic", "longrope")


@dataclass(frozen=True)
class RopeParameters:
    """The rope settings of one model, normalised from ``rope_parameters``/``rope_scaling``."""

    rope_type: str
    rope_theta: float
    head_dim: int
    rotary_dim: int
    max_position_embeddings: int
    params: dict[str, Any]


def rope_parameters_from_config(hf_config: Any, head_dim: int) -> RopeParameters:
    """Read rope settings from a transformers 5 (``rope_parameters``) or 4.x config.

    4.x configs keep ``rope_theta`` at the top level and scaling in ``rope_scaling``
    (``type`` or ``rope_type``); transformers 5 merges both into ``rope_parameters``.
    """
    params: dict[str, Any] = {}
    for attr in ("rope_scaling", "rope_parameters"):
        value = getattr(hf_config, attr, None)
        if isinstance(value, dict):
            params.update(value)
    rope_type = str(params.get("rope_type") or params.get("type") or "default")
    if rope_type not in SUPPORTED_ROPE_TYPES:
        raise ValueError(
            f"rope type {rope_type!r} is not supported; "
            f"supported: {', '.join(SUPPORTED_ROPE_TYPES)}"
        )
    theta = params.get("rope_theta", getattr(hf_config, "rope_theta", None))
    partial = params.get("partial_rotary_factor", getattr(hf_config, "partial_rotary_factor", None))
    max_pos = int(getattr(hf_config, "max_position_embeddings", 2048))
    if rope_type in ("llama3", "yarn", "longrope"):
        params.setdefault(
            "original_max_position_embeddings",
            getattr(hf_config, "original_max_position_embeddings", max_pos),
        )
    return RopeParameters(
        rope_type=rope_type,
        rope_theta=float(theta if theta is not None else 10000.0),
        head_dim=head_dim,
        rotary_dim=int(head_dim * float(partial if partial is not None else 1.0)),
        max_position_embeddings=max_pos,
        params=params,
    )


def _default_inv_freq(base: float, dim: int) -> torch.Tensor:
    return 1.0 / (
        base ** (torch.arange(0, dim, 2, dtype=torch.int64, device="cpu").to(torch.float) / dim)
    )


def _llama3_inv_freq(rope: RopeParameters) -> torch.Tensor:
    inv_freq = _default_inv_freq(rope.rope_theta, rope.rotary_dim)
    p = rope.params
    factor = p["factor"]
    low_freq_factor = p["low_freq_factor"]
    high_freq_factor = p["high_freq_factor"]
    old_context_len = p["original_max_position_embeddings"]
    low_freq_wavelen = old_context_len / low_freq_factor
    high_freq_wavelen = old_context_len / high_freq_factor
    wavelen = 2 * math.pi / inv_freq
    # Long wavelengths are divided by factor, short ones kept, the middle band interpolated.
    inv_freq_llama = torch.where(wavelen > low_freq_wavelen, inv_freq / factor, inv_freq)
    smooth = (old_context_len / wavelen - low_freq_factor) / (high_freq_factor - low_freq_factor)
    smoothed = (1 - smooth) * inv_freq_llama / factor + smooth * inv_freq_llama
    is_medium = ~(wavelen < high_freq_wavelen) * ~(wavelen > low_freq_wavelen)
    return torch.where(is_medium, smoothed, inv_freq_llama)


def _yarn_mscale(scale: float, mscale: float = 1.0) -> float:
    return 1.0 if scale <= 1 else 0.1 * mscale * math.log(scale) + 1.0


def _yarn_inv_freq(rope: RopeParameters) -> tuple[torch.Tensor, float]:
    p = rope.params
    base, dim = rope.rope_theta, rope.rotary_dim
    original_max = p["original_max_position_embeddings"]
    factor = p.get("factor")
    if factor is None:
        factor = rope.max_position_embeddings / original_max
    attention_factor = p.get("attention_factor")
    mscale, mscale_all_dim = p.get("mscale"), p.get("mscale_all_dim")
    if attention_factor is None:
        if mscale and mscale_all_dim:
            attention_factor = _yarn_mscale(factor, mscale) / _yarn_mscale(factor, mscale_all_dim)
        else:
            attention_factor = _yarn_mscale(factor)
    beta_fast = p.get("beta_fast") or 32
    beta_slow = p.get("beta_slow") or 1

    def correction_dim(num_rotations: float) -> float:
        return (dim * math.log(original_max / (num_rotations * 2 * math.pi))) / (2 * math.log(base))

    low, high = correction_dim(beta_fast), correction_dim(beta_slow)
    if p.get("truncate", True):
        low, high = math.floor(low), math.ceil(high)
    low, high = max(low, 0), min(high, dim - 1)
    if low == high:
        high += 0.001  # as HF: avoid a zero-width ramp
    ramp = torch.clamp(
        (torch.arange(dim // 2, dtype=torch.float32, device="cpu") - low) / (high - low), 0, 1
    )
    pos_freqs = base ** (torch.arange(0, dim, 2, device="cpu").to(torch.float) / dim)
    extrapolation, interpolation = 1.0 / pos_freqs, 1.0 / (factor * pos_freqs)
    extrapolation_factor = 1 - ramp
    inv_freq = interpolation * (1 - extrapolation_factor) + extrapolation * extrapolation_factor
    return inv_freq, float(attention_factor)


def _longrope_inv_freq(rope: RopeParameters, which: str) -> tuple[torch.Tensor, float]:
    """LongRoPE (Phi-3): per-frequency divisors ``short_factor`` / ``long_factor``, and
    cos/sin scaled by ``sqrt(1 + ln(factor) / ln(original_max))`` (or ``attention_factor``)."""
    p = rope.params
    original_max = int(p["original_max_position_embeddings"])
    factor = p.get("factor")
    if factor is None:
        factor = rope.max_position_embeddings / original_max
    attention_factor = p.get("attention_factor")
    if attention_factor is None:
        attention_factor = (
            1.0 if factor <= 1.0 else math.sqrt(1 + math.log(factor) / math.log(original_max))
        )
    ext = torch.tensor(p[which], dtype=torch.float32, device="cpu")
    dim = rope.rotary_dim
    if ext.numel() != dim // 2:
        raise ValueError(
            f"rope_scaling.{which} has {ext.numel()} entries; a rotary dimension of {dim} "
            f"needs {dim // 2}"
        )
    exponent = torch.arange(0, dim, 2, dtype=torch.int64, device="cpu").float() / dim
    return 1.0 / (ext * rope.rope_theta**exponent), float(attention_factor)


def compute_inv_freq(rope: RopeParameters) -> tuple[torch.Tensor, float]:
    """Inverse frequencies [rotary_dim / 2] (float32) and the cos/sin scaling factor.

    ``dynamic`` (dynamic NTK) uses the unscaled frequencies: HF rescales them only for
    sequences longer than the original context, per batch, which a batched engine cannot
    reproduce; within ``original_max_position_embeddings`` the two agree exactly.
    """
    if rope.rope_type in ("default", "dynamic"):
        return _default_inv_freq(rope.rope_theta, rope.rotary_dim), 1.0
    if rope.rope_type == "linear":
        return _default_inv_freq(rope.rope_theta, rope.rotary_dim) / rope.params["factor"], 1.0
    if rope.rope_type == "llama3":
        return _llama3_inv_freq(rope), 1.0
    if rope.rope_type == "yarn":
        return _yarn_inv_freq(rope)
    if rope.rope_type == "longrope":
        return _longrope_inv_freq(rope, "short_factor")
    raise ValueError(f"rope type {rope.rope_type!r} is not supported")


def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat((-x2, x1), dim=-1)


def apply_rotary(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate the first ``cos.shape[-1]`` dims of ``x`` [num_tokens, heads, head_dim]."""
    if fused_ops.enabled(x):
        return fused_ops.apply_rotary(x, cos, sin)
    rotary_dim = cos.shape[-1]
    if rotary_dim == x.shape[-1]:
        return x * cos + _rotate_half(x) * sin
    x_rot, x_pass = x[..., :rotary_dim], x[..., rotary_dim:]
    return torch.cat((x_rot * cos + _rotate_half(x_rot) * sin, x_pass), dim=-1)


class RotaryEmbedding(torch.nn.Module):
    """Rope for query and key tensors shaped [num_tokens, num_heads, head_dim].

    A model computes ``cos_sin`` once per step and calls ``apply_rotary`` in every layer.

    LongRoPE switches from the short to the long factors for the whole step when any
    position reaches ``original_max_position_embeddings``, as transformers (per forward)
    and vLLM (per batch) do; the choice is made on the device, without a host sync.
    """

    inv_freq: torch.Tensor
    long_inv_freq: torch.Tensor | None

    def __init__(self, rope: RopeParameters) -> None:
        super().__init__()
        self.rope = rope
        # Computed on the CPU as HF does, then moved to the device the model is built on.
        inv_freq, scaling = compute_inv_freq(rope)
        inv_freq = inv_freq.to(torch.get_default_device())
        self.register_buffer("inv_freq", inv_freq, persistent=False)
        self.attention_scaling = scaling
        long_inv_freq: torch.Tensor | None = None
        self.original_max = 0
        if rope.rope_type == "longrope":
            long_inv_freq, _ = _longrope_inv_freq(rope, "long_factor")
            long_inv_freq = long_inv_freq.to(torch.get_default_device())
            self.original_max = int(rope.params["original_max_position_embeddings"])
        self.register_buffer("long_inv_freq", long_inv_freq, persistent=False)

    def cos_sin(self, positions: torch.Tensor, dtype: torch.dtype) -> tuple[torch.Tensor, ...]:
        """cos and sin [num_tokens, 1, rotary_dim] in ``dtype`` (computed in float32)."""
        inv_freq = self.inv_freq
        if self.long_inv_freq is not None:
            is_long = (positions >= self.original_max).any()
            inv_freq = torch.where(is_long, self.long_inv_freq, self.inv_freq)
        freqs = positions.to(torch.float32)[:, None] * inv_freq[None, :]
        emb = torch.cat((freqs, freqs), dim=-1)
        cos = (emb.cos() * self.attention_scaling).to(dtype)
        sin = (emb.sin() * self.attention_scaling).to(dtype)
        return cos[:, None, :], sin[:, None, :]

    def forward(
        self, positions: torch.Tensor, query: torch.Tensor, key: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        cos, sin = self.cos_sin(positions, query.dtype)
        return apply_rotary(query, cos, sin), apply_rotary(key, cos, sin)
