"""LlamaForCausalLM and MistralForCausalLM: the generic decoder, configured from config.json.

Mistral differs from Llama only by ``sliding_window``, which the generic decoder reads
from the config for every layer.
"""

from __future__ import annotations

from typing import ClassVar

from engine_sdk.layers.decoder import DecoderForCausalLM, DecoderOptions


class LlamaForCausalLM(DecoderForCausalLM):
    options: ClassVar[DecoderOptions] = DecoderOptions()


class MistralForCausalLM(DecoderForCausalLM):
    options: ClassVar[DecoderOptions] = DecoderOptions(attention_bias=False, mlp_bias=False)
