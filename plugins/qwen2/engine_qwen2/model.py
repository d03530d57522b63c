"""Qwen2ForCausalLM: the generic decoder with a bias on q, k and v (not on o_proj).

Qwen2 and Qwen2.5 checkpoints differ from Llama only there; tied embeddings (the 0.5B,
1.5B and 3B sizes) follow ``tie_word_embeddings`` and sliding-window layers follow
``use_sliding_window`` / ``max_window_layers`` through the config's ``layer_types``.
"""

from __future__ import annotations

from typing import ClassVar

from engine_sdk.layers.decoder import DecoderForCausalLM, DecoderOptions


class Qwen2ForCausalLM(DecoderForCausalLM):
    options: ClassVar[DecoderOptions] = DecoderOptions(
        attention_bias=True, o_proj_bias=False, mlp_bias=False
    )
