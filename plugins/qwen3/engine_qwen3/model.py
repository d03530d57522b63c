"""Qwen3ForCausalLM: the generic decoder with per-head q/k RMSNorm."""

from __future__ import annotations

from typing import ClassVar

from engine_sdk.layers.decoder import DecoderForCausalLM, DecoderOptions


class Qwen3ForCausalLM(DecoderForCausalLM):
    options: ClassVar[DecoderOptions] = DecoderOptions(qk_norm=True)
