"""Torch layers model plugins are written against (import torch; load lazily).

``Linear`` takes its weights and matmul from a quantization method; ``Attention`` wraps the
engine's attention backend; ``DecoderForCausalLM`` is the generic Llama-style model that
the Llama, Mistral and Qwen3 plugins configure.
"""

from __future__ import annotations

from engine_sdk.layers.activation import GatedMLP, silu_and_mul
from engine_sdk.layers.attention import Attention
from engine_sdk.layers.decoder import DecoderForCausalLM, DecoderOptions, head_dim_of
from engine_sdk.layers.embedding import LMHead, VocabEmbedding
from engine_sdk.layers.linear import Linear, UnquantizedLinearMethod
from engine_sdk.layers.norm import RMSNorm
from engine_sdk.layers.rotary import (
    RopeParameters,
    RotaryEmbedding,
    apply_rotary,
    compute_inv_freq,
    rope_parameters_from_config,
)

__all__ = [
    "Attention",
    "DecoderForCausalLM",
    "DecoderOptions",
    "GatedMLP",
    "LMHead",
    "Linear",
    "RMSNorm",
    "RopeParameters",
    "RotaryEmbedding",
    "UnquantizedLinearMethod",
    "VocabEmbedding",
    "apply_rotary",
    "compute_inv_freq",
    "head_dim_of",
    "rope_parameters_from_config",
    "silu_and_mul",
]
