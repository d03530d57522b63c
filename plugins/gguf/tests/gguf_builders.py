"""Tiny GGUF files written by the tests with ``gguf.GGUFWriter`` (no downloads).

``write_tiny_gguf`` writes a random model of a given architecture with a byte-level BPE
tokenizer and returns the Hugging Face-layout tensors the loader must give back. For
llama it permutes q/k rows the way llama.cpp's converter does, so a loader that forgets
to undo it fails.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import gguf
import numpy as np
from transformers.convert_slow_tokenizer import bytes_to_unicode

CHAT_TEMPLATE = (
    "{% for message in messages %}{{ '<|im_start|>' + message['role'] + '\n' + "
    "message['content'] + '<|im_end|>\n' }}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)
MERGES = [
    ("h", "e"),
    ("l", "l"),
    ("he", "ll"),
    ("hell", "o"),
    ("Ġ", "w"),
    ("o", "r"),
    ("Ġw", "or"),
    ("l", "d"),
    ("Ġwor", "ld"),
]
SPECIAL_TOKENS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]


def tiny_vocab() -> tuple[list[str], list[int], list[str]]:
    """(tokens, token types, merges): 256 byte tokens, the merged words, 3 control tokens."""
    tokens = [bytes_to_unicode()[b] for b in range(256)]
    tokens += [a + b for a, b in MERGES]
    types = [int(gguf.TokenType.NORMAL)] * len(tokens)
    tokens += SPECIAL_TOKENS
    types += [int(gguf.TokenType.CONTROL)] * len(SPECIAL_TOKENS)
    return tokens, types, [f"{a} {b}" for a, b in MERGES]


def llamacpp_permute(weight: np.ndarray, num_heads: int) -> np.ndarray:
    """llama.cpp convert_hf_to_gguf.py's ``LlamaModel.permute`` (HF rows -> GGUF rows)."""
    return (
        weight.reshape(num_heads, 2, weight.shape[0] // num_heads // 2, *weight.shape[1:])
        .swapaxes(1, 2)
        .reshape(weight.shape)
    )


@dataclass
class TinySpec:
    """Shape and options of a tiny model."""

    arch: str = "llama"
    hidden_size: int = 64
    num_layers: int = 2
    num_heads: int = 4
    num_kv_heads: int = 2
    head_dim: int = 16
    intermediate_size: int = 96
    tied: bool = True
    qtype: gguf.GGMLQuantizationType = gguf.GGMLQuantizationType.F32
    tokenizer_pre: str = "gpt-2"
    with_tokenizer: bool = True
    extra_metadata: dict[str, object] = field(default_factory=dict)


@dataclass
class TinyGGUF:
    """What ``write_tiny_gguf`` wrote: the file and the HF-layout reference tensors.

    ``expected`` holds what the loader must return exactly (quantize -> dequantize applied
    to quantized tensors); ``original`` the float32 values before quantization.
    """

    path: Path
    spec: TinySpec
    vocab_size: int
    expected: dict[str, np.ndarray]
    original: dict[str, np.ndarray]


def _hf_tensors(spec: TinySpec, vocab_size: int, rng: np.random.Generator) -> dict[str, np.ndarray]:
    def rand(*shape: int) -> np.ndarray:
        return (rng.standard_normal(shape) * 0.2).astype(np.float32)

    h, d = spec.hidden_size, spec.head_dim
    out = {"model.embed_tokens.weight": rand(vocab_size, h), "model.norm.weight": 1 + rand(h)}
    if not spec.tied:
        out["lm_head.weight"] = rand(vocab_size, h)
    for i in range(spec.num_layers):
        p = f"model.layers.{i}."
        out[p + "self_attn.q_proj.weight"] = rand(spec.num_heads * d, h)
        out[p + "self_attn.k_proj.weight"] = rand(spec.num_kv_heads * d, h)
        out[p + "self_attn.v_proj.weight"] = rand(spec.num_kv_heads * d, h)
        out[p + "self_attn.o_proj.weight"] = rand(h, spec.num_heads * d)
        out[p + "mlp.gate_proj.weight"] = rand(spec.intermediate_size, h)
        out[p + "mlp.up_proj.weight"] = rand(spec.intermediate_size, h)
        out[p + "mlp.down_proj.weight"] = rand(h, spec.intermediate_size)
        out[p + "input_layernorm.weight"] = 1 + rand(h)
        out[p + "post_attention_layernorm.weight"] = 1 + rand(h)
        if spec.arch == "qwen2":
            heads = {"q": spec.num_heads, "k": spec.num_kv_heads, "v": spec.num_kv_heads}
            for proj, rows in heads.items():
                out[p + f"self_attn.{proj}_proj.bias"] = rand(rows * d)
        if spec.arch == "qwen3":
            out[p + "self_attn.q_norm.weight"] = 1 + rand(d)
            out[p + "self_attn.k_norm.weight"] = 1 + rand(d)
        if spec.arch == "phi3":  # Phi-3 checkpoints fuse q/k/v and gate/up
            qkv = [out.pop(p + f"self_attn.{x}_proj.weight") for x in "qkv"]
            out[p + "self_attn.qkv_proj.weight"] = np.concatenate(qkv)
            gate_up = [out.pop(p + f"mlp.{x}_proj.weight") for x in ("gate", "up")]
            out[p + "mlp.gate_up_proj.weight"] = np.concatenate(gate_up)
    return out


_GGUF_NAMES = {
    "self_attn.q_proj": "attn_q",
    "self_attn.k_proj": "attn_k",
    "self_attn.v_proj": "attn_v",
    "self_attn.o_proj": "attn_output",
    "self_attn.qkv_proj": "attn_qkv",
    "mlp.gate_up_proj": "ffn_up",
    "self_attn.q_norm": "attn_q_norm",
    "self_attn.k_norm": "attn_k_norm",
    "mlp.gate_proj": "ffn_gate",
    "mlp.up_proj": "ffn_up",
    "mlp.down_proj": "ffn_down",
    "input_layernorm": "attn_norm",
    "post_attention_layernorm": "ffn_norm",
}


def gguf_name(hf: str) -> str:
    """Test-side HF -> GGUF name (written independently of the plugin's mapping)."""
    fixed = {
        "model.embed_tokens.weight": "token_embd.weight",
        "model.norm.weight": "output_norm.weight",
        "lm_head.weight": "output.weight",
    }
    if hf in fixed:
        return fixed[hf]
    _, _, layer, *rest = hf.split(".")
    module, kind = ".".join(rest[:-1]), rest[-1]
    return f"blk.{layer}.{_GGUF_NAMES[module]}.{kind}"


def _write_metadata(w: gguf.GGUFWriter, spec: TinySpec, tokens, types, merges) -> None:
    w.add_block_count(spec.num_layers)
    w.add_context_length(256)
    w.add_embedding_length(spec.hidden_size)
    w.add_feed_forward_length(spec.intermediate_size)
    w.add_head_count(spec.num_heads)
    w.add_head_count_kv(spec.num_kv_heads)
    if spec.head_dim * spec.num_heads != spec.hidden_size:
        w.add_key_length(spec.head_dim)
        w.add_value_length(spec.head_dim)
    w.add_rope_freq_base(10000.0)
    w.add_layer_norm_rms_eps(1e-6)
    for key, value in spec.extra_metadata.items():
        if isinstance(value, str):
            w.add_string(key, value)
        elif isinstance(value, int):
            w.add_uint32(key, value)
        else:
            w.add_float32(key, float(value))
    if not spec.with_tokenizer:
        return
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre(spec.tokenizer_pre)
    w.add_token_list(tokens)
    w.add_token_types(types)
    w.add_token_merges(merges)
    w.add_bos_token_id(tokens.index("<|im_start|>"))
    w.add_eos_token_id(tokens.index("<|im_end|>"))
    w.add_pad_token_id(tokens.index("<|endoftext|>"))
    w.add_add_bos_token(False)
    w.add_chat_template(CHAT_TEMPLATE)


def _encode(values: np.ndarray, qtype: gguf.GGMLQuantizationType) -> tuple[np.ndarray, np.ndarray]:
    """(bytes or array to write, what dequantizing it gives back)."""
    if qtype == gguf.GGMLQuantizationType.F32:
        return values, values
    if qtype == gguf.GGMLQuantizationType.F16:
        half = values.astype(np.float16)
        return half, half.astype(np.float32)
    packed = gguf.quants.quantize(values, qtype)
    return packed, gguf.quants.dequantize(packed, qtype).astype(np.float32)


def write_tiny_gguf(
    path: Path, spec: TinySpec, seed: int = 0, extra_tensors: dict[str, np.ndarray] | None = None
) -> TinyGGUF:
    """Write a tiny random ``spec.arch`` model to ``path`` (a ``.gguf`` file)."""
    tokens, types, merges = tiny_vocab()
    original = _hf_tensors(spec, len(tokens), np.random.default_rng(seed))
    w = gguf.GGUFWriter(str(path), spec.arch)
    _write_metadata(w, spec, tokens, types, merges)
    expected: dict[str, np.ndarray] = {}
    for hf, values in original.items():
        on_disk = values
        if spec.arch == "llama" and ".q_proj." in hf:
            on_disk = llamacpp_permute(values, spec.num_heads)
        elif spec.arch == "llama" and ".k_proj." in hf:
            on_disk = llamacpp_permute(values, spec.num_kv_heads)
        # Norms and biases stay F32, as llama.cpp writes them; 2-D weights take spec.qtype.
        qtype = spec.qtype if values.ndim == 2 else gguf.GGMLQuantizationType.F32
        data, _ = _encode(on_disk, qtype)
        raw_dtype = qtype if data.dtype == np.uint8 else None
        w.add_tensor(gguf_name(hf), data, raw_dtype=raw_dtype)
        # Quantization blocks run along a row, so permuting rows commutes with it: the
        # loader must give back exactly the round trip of the un-permuted HF tensor.
        expected[hf] = _encode(values, qtype)[1]
    for name, values in (extra_tensors or {}).items():
        w.add_tensor(name, values)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return TinyGGUF(path, spec, len(tokens), expected, original)
