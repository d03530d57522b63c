"""GGUF metadata -> a transformers config (``LlamaConfig``, ``Qwen2Config``, ``Qwen3Config``).

GGUF key (under ``{arch}.``)          config field
-----------------------------------   ------------------------------------------
embedding_length                      hidden_size
block_count                           num_hidden_layers
feed_forward_length                   intermediate_size
attention.head_count / head_count_kv  num_attention_heads / num_key_value_heads
attention.key_length                  head_dim (else hidden_size / heads)
attention.layer_norm_rms_epsilon      rms_norm_eps
context_length                        max_position_embeddings
rope.freq_base, rope.scaling.*        rope_parameters (see ``rope.py``)
rope_factors_long/short tensors       phi3: longrope short/long factors, with
  rope.scaling.original_context_length,   original_max_position_embeddings,
  rope.scaling.attn_factor                attention_factor
rope.dimension_count < head_dim       partial_rotary_factor
token_embd rows / vocab_size / tokens vocab_size
no ``output.weight`` tensor           tie_word_embeddings = True
"""

from __future__ import annotations

from typing import Any

import transformers

from engine_gguf.architectures import GGUFArchitecture, get_architecture
from engine_gguf.metadata import GGUFFile
from engine_gguf.rope import (
    llama3_rope_parameters,
    rope_parameters_from_metadata,
    tidy_float,
)
from engine_gguf.weights import read_tensor_f32


def build_hf_config(gf: GGUFFile) -> transformers.PretrainedConfig:
    """The transformers config describing ``gf``'s model."""
    arch = get_architecture(gf.architecture)
    hidden_size = int(gf.require_arch("embedding_length"))
    num_heads = _uniform(gf, "attention.head_count")
    num_kv_heads = _uniform(gf, "attention.head_count_kv", default=num_heads)
    head_dim = int(gf.get_arch("attention.key_length") or hidden_size // num_heads)
    kwargs: dict[str, Any] = dict(arch.defaults)
    kwargs.update(
        architectures=[arch.hf_architecture],
        vocab_size=_vocab_size(gf),
        hidden_size=hidden_size,
        intermediate_size=_uniform(gf, "feed_forward_length"),
        num_hidden_layers=int(gf.require_arch("block_count")),
        num_attention_heads=num_heads,
        num_key_value_heads=num_kv_heads,
        head_dim=head_dim,
        rms_norm_eps=tidy_float(gf.require_arch("attention.layer_norm_rms_epsilon")),
        max_position_embeddings=int(gf.require_arch("context_length")),
        rope_parameters=_rope_parameters(gf, head_dim),
        **_partial_rotary(gf, head_dim),
        tie_word_embeddings="output.weight" not in gf.tensors,
        **_special_token_ids(gf),
        **_bias_flags(gf, arch),
    )
    rope = kwargs["rope_parameters"]
    if rope.get("rope_type") == "longrope":  # Phi3Config's own default (4096) would win
        kwargs["original_max_position_embeddings"] = rope["original_max_position_embeddings"]
    config_class = getattr(transformers, arch.config_class)
    config: transformers.PretrainedConfig = config_class(**kwargs)
    return config


def _uniform(gf: GGUFFile, suffix: str, default: int | None = None) -> int:
    # Some converters write per-layer arrays; this loader needs one value for all layers.
    value = gf.get_arch(suffix, default)
    if value is None:
        value = gf.require_arch(suffix)
    if isinstance(value, list):
        if len(set(value)) != 1:
            raise ValueError(
                f"GGUF {gf.arch_key(suffix)} differs per layer ({value}); the gguf plugin "
                "supports only models with the same value in every layer"
            )
        value = value[0]
    return int(value)


def _vocab_size(gf: GGUFFile) -> int:
    # The embedding's row count is what the weights need; the token list may be shorter.
    if "token_embd.weight" in gf.tensors:
        return gf.torch_shape("token_embd.weight")[0]
    size = gf.get_arch("vocab_size") or gf.array_len("tokenizer.ggml.tokens")
    if size is None:
        raise ValueError(f"GGUF file {gf.path} has no token_embd.weight and no vocabulary")
    return int(size)


def _partial_rotary(gf: GGUFFile, head_dim: int) -> dict[str, float]:
    rotary_dim = gf.get_arch("rope.dimension_count")
    if rotary_dim is None or int(rotary_dim) == head_dim:
        return {}
    return {"partial_rotary_factor": int(rotary_dim) / head_dim}


def _longrope_parameters(gf: GGUFFile, rope_theta: float) -> dict[str, Any]:
    """Phi-3's LongRoPE: the factor lists are tensors, the original context metadata."""
    original = gf.get_arch("rope.scaling.original_context_length")
    if original is None:
        raise ValueError(
            f"GGUF file {gf.path} has rope_factors_long but no "
            f"{gf.arch_key('rope.scaling.original_context_length')}; re-convert it with a "
            "recent llama.cpp convert_hf_to_gguf.py"
        )
    params: dict[str, Any] = {
        "rope_type": "longrope",
        "rope_theta": rope_theta,
        "long_factor": [tidy_float(v) for v in read_tensor_f32(gf, "rope_factors_long.weight")],
        "short_factor": [tidy_float(v) for v in read_tensor_f32(gf, "rope_factors_short.weight")],
        "original_max_position_embeddings": int(original),
    }
    attn_factor = gf.get_arch("rope.scaling.attn_factor")
    if attn_factor is not None:
        params["attention_factor"] = tidy_float(attn_factor)
    return params


def _rope_parameters(gf: GGUFFile, head_dim: int) -> dict[str, Any]:
    rope_theta = tidy_float(gf.get_arch("rope.freq_base", 10000.0))
    if "rope_factors_long.weight" in gf.tensors:
        return _longrope_parameters(gf, rope_theta)
    scaling_type = gf.get_arch("rope.scaling.type")
    if "rope_freqs.weight" in gf.tensors and scaling_type in (None, "none"):
        divisors = read_tensor_f32(gf, "rope_freqs.weight")
        return llama3_rope_parameters(divisors, head_dim, rope_theta)
    factor = gf.get_arch("rope.scaling.factor")
    return rope_parameters_from_metadata(
        scaling_type,
        rope_theta,
        tidy_float(factor) if factor is not None else None,
        gf.get_arch("rope.scaling.original_context_length"),
        gf.get_arch("rope.scaling.yarn_beta_fast"),
        gf.get_arch("rope.scaling.yarn_beta_slow"),
    )


def _special_token_ids(gf: GGUFFile) -> dict[str, int | None]:
    return {
        "bos_token_id": gf.get("tokenizer.ggml.bos_token_id"),
        "eos_token_id": gf.get("tokenizer.ggml.eos_token_id"),
        "pad_token_id": gf.get("tokenizer.ggml.padding_token_id"),
    }


def _bias_flags(gf: GGUFFile, arch: GGUFArchitecture) -> dict[str, bool]:
    if arch.name == "qwen2":  # Qwen2 always has q/k/v biases and no flag for them.
        return {}
    flags = {"attention_bias": "blk.0.attn_q.bias" in gf.tensors}
    if arch.name == "llama":
        flags["mlp_bias"] = "blk.0.ffn_up.bias" in gf.tensors
    return flags
