"""GGUF tensor names -> Hugging Face parameter names.

token_embd.weight           model.embed_tokens.weight
output_norm.weight          model.norm.weight
output.weight               lm_head.weight
blk.{i}.attn_q.{weight,bias}    model.layers.{i}.self_attn.q_proj.{weight,bias}
blk.{i}.ffn_gate.weight     model.layers.{i}.mlp.gate_proj.weight
...                         (see ``_BLOCK_PARTS``)

phi3 keeps Phi-3's fused tensors: ``attn_qkv`` is ``self_attn.qkv_proj`` and its
``ffn_up`` is ``mlp.gate_up_proj`` (gate rows, then up rows); the Phi-3 model plugin
splits them.
"""

from __future__ import annotations

import re

_GLOBAL = {
    "token_embd": "model.embed_tokens",
    "output_norm": "model.norm",
    "output": "lm_head",
}

_BLOCK_PARTS = {
    "attn_q": "self_attn.q_proj",
    "attn_k": "self_attn.k_proj",
    "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj",
    "attn_q_norm": "self_attn.q_norm",
    "attn_k_norm": "self_attn.k_norm",
    "attn_norm": "input_layernorm",
    "ffn_norm": "post_attention_layernorm",
    "ffn_gate": "mlp.gate_proj",
    "ffn_up": "mlp.up_proj",
    "ffn_down": "mlp.down_proj",
}

# Per-architecture differences from ``_BLOCK_PARTS``.
_ARCH_BLOCK_PARTS = {"phi3": {"attn_qkv": "self_attn.qkv_proj", "ffn_up": "mlp.gate_up_proj"}}

# Tensors the loader consumes into the config instead of yielding as parameters.
CONFIG_ONLY_TENSORS = frozenset(
    {"rope_freqs.weight", "rope_factors_long.weight", "rope_factors_short.weight"}
)

_BLOCK_RE = re.compile(r"^blk\.(\d+)\.([a-z_]+)\.(weight|bias)$")
_GLOBAL_RE = re.compile(r"^([a-z_]+)\.(weight|bias)$")


def hf_name(gguf_name: str, arch: str = "") -> str:
    """The HF parameter name of GGUF tensor ``gguf_name`` of architecture ``arch``;
    ValueError when unknown."""
    parts = {**_BLOCK_PARTS, **_ARCH_BLOCK_PARTS.get(arch, {})}
    match = _BLOCK_RE.match(gguf_name)
    if match and match.group(2) in parts:
        layer, part, kind = match.groups()
        return f"model.layers.{layer}.{parts[part]}.{kind}"
    match = _GLOBAL_RE.match(gguf_name)
    if match and match.group(1) in _GLOBAL:
        return f"{_GLOBAL[match.group(1)]}.{match.group(2)}"
    raise ValueError(
        f"GGUF tensor {gguf_name!r} has no Hugging Face counterpart in the gguf plugin; "
        "the file holds a model layout this loader does not support"
    )
