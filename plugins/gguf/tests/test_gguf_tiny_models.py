"""Tiny GGUFs written by the tests load with the right config, names, shapes and values.

Each model is also run: transformers' model built from the loaded config and weights must
give the same logits as one built from the reference Hugging Face tensors, which fails if
the q/k un-permutation or a name mapping is wrong.
"""

from __future__ import annotations

from pathlib import Path

import gguf
import numpy as np
import pytest
import torch
import transformers
from engine_gguf.format import GGUFFormat
from engine_gguf.weights import reverse_permute
from gguf_builders import TinySpec, llamacpp_permute, write_tiny_gguf

Q = gguf.GGMLQuantizationType
MODEL_CLASSES = {
    "llama": transformers.LlamaForCausalLM,
    "qwen2": transformers.Qwen2ForCausalLM,
    "phi3": transformers.Phi3ForCausalLM,
    "qwen3": transformers.Qwen3ForCausalLM,
}


def _reference_model(config, tensors: dict[str, np.ndarray]) -> torch.nn.Module:
    model = MODEL_CLASSES[config.model_type](config).eval()
    state = {k: torch.from_numpy(v.copy()) for k, v in tensors.items()}
    missing, unexpected = model.load_state_dict(state, strict=False)
    assert not unexpected and set(missing) <= {"lm_head.weight"}
    return model


def _load(tiny, dtype=torch.float32):
    fmt = GGUFFormat(tiny.path)
    config = fmt.load_config()
    weights = dict(fmt.iter_weights(dtype))
    return fmt, config, weights


def _check_strict_load(config, weights) -> torch.nn.Module:
    model = MODEL_CLASSES[config.model_type](config).eval()
    expected_keys = set(model.state_dict())
    if config.tie_word_embeddings:
        expected_keys.discard("lm_head.weight")
    assert set(weights) == expected_keys
    missing, unexpected = model.load_state_dict(weights, strict=False)
    assert unexpected == [] and set(missing) == set(model.state_dict()) - expected_keys
    return model


@pytest.mark.parametrize("qtype", [Q.F32, Q.F16, Q.Q8_0, Q.Q4_1], ids=lambda q: q.name)
def test_tiny_llama_values_and_shapes(tmp_path: Path, qtype: Q) -> None:
    tiny = write_tiny_gguf(tmp_path / "tiny.gguf", TinySpec(qtype=qtype))
    _, config, weights = _load(tiny)
    assert set(weights) == set(tiny.expected)
    for name, ref in tiny.expected.items():
        got = weights[name]
        assert got.dtype == torch.float32 and tuple(got.shape) == ref.shape, name
        torch.testing.assert_close(got, torch.from_numpy(ref), rtol=0, atol=0, msg=name)
    # And close to the unquantized values (Q8_0: 1/127 of a block's max; Q4_1: 1/15 range).
    atol = {Q.F32: 0.0, Q.F16: 1e-3, Q.Q8_0: 0.01, Q.Q4_1: 0.12}[qtype]
    for name, orig in tiny.original.items():
        assert np.abs(weights[name].numpy() - orig).max() <= atol, name


def test_tiny_llama_config(tmp_path: Path) -> None:
    tiny = write_tiny_gguf(tmp_path / "tiny.gguf", TinySpec())
    config = GGUFFormat(tiny.path).load_config()
    assert isinstance(config, transformers.LlamaConfig)
    assert config.architectures == ["LlamaForCausalLM"]
    assert (config.hidden_size, config.num_hidden_layers, config.intermediate_size) == (64, 2, 96)
    assert (config.num_attention_heads, config.num_key_value_heads, config.head_dim) == (4, 2, 16)
    assert config.vocab_size == tiny.vocab_size == 268
    assert config.max_position_embeddings == 256
    assert config.rms_norm_eps == 1e-6
    assert config.rope_parameters == {"rope_type": "default", "rope_theta": 10000.0}
    assert config.tie_word_embeddings is True
    assert (config.bos_token_id, config.eos_token_id, config.pad_token_id) == (266, 267, 265)
    assert config.attention_bias is False and config.mlp_bias is False


@pytest.mark.parametrize(
    "spec",
    [
        TinySpec(arch="llama", qtype=Q.F32, tied=False),
        TinySpec(arch="llama", qtype=Q.Q8_0),
        TinySpec(arch="qwen2", qtype=Q.F32),
        TinySpec(arch="phi3", qtype=Q.F32, num_kv_heads=4),
        # qwen3: head_dim (24) != hidden_size / num_heads (16), from attention.key_length
        TinySpec(arch="qwen3", qtype=Q.F16, head_dim=24),
    ],
    ids=["llama-untied", "llama-q8_0", "qwen2-bias", "phi3-fused", "qwen3-qknorm"],
)
def test_tiny_model_logits_match_reference(tmp_path: Path, spec: TinySpec) -> None:
    tiny = write_tiny_gguf(tmp_path / "tiny.gguf", spec)
    _, config, weights = _load(tiny)
    assert config.architectures == [MODEL_CLASSES[spec.arch].__name__]
    assert config.head_dim == spec.head_dim
    assert config.tie_word_embeddings is spec.tied
    model = _check_strict_load(config, weights)
    reference = _reference_model(config, tiny.expected)
    input_ids = torch.tensor([[1, 5, 42, 200, 7, 99, 3, 250]])
    with torch.no_grad():
        got = model(input_ids).logits
        want = reference(input_ids).logits
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)


def test_permuted_llama_without_unpermute_differs(tmp_path: Path) -> None:
    # Guards the test above: loading the raw GGUF rows must change the logits.
    tiny = write_tiny_gguf(tmp_path / "tiny.gguf", TinySpec())
    _, config, weights = _load(tiny)
    raw = dict(weights)
    for name in raw:
        if ".q_proj." in name:
            raw[name] = torch.from_numpy(llamacpp_permute(raw[name].numpy(), 4))
    input_ids = torch.tensor([[1, 5, 42, 200, 7]])
    with torch.no_grad():
        a = _check_strict_load(config, weights)(input_ids).logits
        b = _check_strict_load(config, raw)(input_ids).logits
    assert not torch.allclose(a, b, atol=1e-3)


def test_dtype_conversion(tmp_path: Path) -> None:
    tiny = write_tiny_gguf(tmp_path / "tiny.gguf", TinySpec(qtype=Q.Q8_0))
    _, _, weights = _load(tiny, torch.bfloat16)
    for name, ref in tiny.expected.items():
        assert weights[name].dtype == torch.bfloat16
        torch.testing.assert_close(weights[name], torch.from_numpy(ref).to(torch.bfloat16))


@pytest.mark.parametrize("num_heads", [1, 3, 4])
def test_reverse_permute_inverts_llamacpp_and_matches_transformers(num_heads: int) -> None:
    from transformers.modeling_gguf_pytorch_utils import LlamaTensorProcessor

    rng = np.random.default_rng(num_heads)
    w = rng.standard_normal((num_heads * 8, 5)).astype(np.float32)
    permuted = llamacpp_permute(w, num_heads)
    assert not np.array_equal(permuted, w)
    np.testing.assert_array_equal(reverse_permute(permuted, num_heads), w)
    theirs = LlamaTensorProcessor()._reverse_permute_weights(permuted, num_heads, num_heads)
    np.testing.assert_array_equal(reverse_permute(permuted, num_heads), theirs)
    bias = rng.standard_normal(num_heads * 8).astype(np.float32)
    permuted_bias = llamacpp_permute(bias, num_heads)
    np.testing.assert_array_equal(reverse_permute(permuted_bias, num_heads), bias)


def test_generation_config_from_sampling_metadata(tmp_path: Path) -> None:
    extra = {
        "general.sampling.temp": 0.6,
        "general.sampling.top_p": 0.9,
        "general.sampling.top_k": 20,
        "tokenizer.ggml.eot_token_id": 265,
    }
    tiny = write_tiny_gguf(tmp_path / "tiny.gguf", TinySpec(extra_metadata=extra))
    got = GGUFFormat(tiny.path).generation_config()
    assert (got["temperature"], got["top_p"]) == (0.6, 0.9)  # float32 metadata, tidied
    assert got["top_k"] == 20
    assert got["eos_token_id"] == [267, 265] and got["bos_token_id"] == 266
    plain = write_tiny_gguf(tmp_path / "plain.gguf", TinySpec())
    assert GGUFFormat(plain.path).generation_config() == {"eos_token_id": 267, "bos_token_id": 266}


def test_unsupported_architecture_is_a_clear_error(tmp_path: Path) -> None:
    tiny = write_tiny_gguf(tmp_path / "tiny.gguf", TinySpec(arch="gemma"))
    with pytest.raises(ValueError, match="'gemma' is not supported.*llama, phi3, qwen2, qwen3"):
        GGUFFormat(tiny.path).load_config()


def test_unknown_tensor_is_a_clear_error(tmp_path: Path) -> None:
    extra = {"blk.0.attn_qkv.weight": np.zeros((4, 8), np.float32)}
    tiny = write_tiny_gguf(tmp_path / "tiny.gguf", TinySpec(), extra_tensors=extra)
    with pytest.raises(ValueError, match="'blk.0.attn_qkv.weight' has no Hugging Face"):
        dict(GGUFFormat(tiny.path).iter_weights(torch.float32))


def test_phi3_longrope_and_partial_rotary_from_metadata(tmp_path: Path) -> None:
    """Phi-3 LongRoPE: factor lists from tensors, original context and attn factor keys."""
    long = np.linspace(1.0, 8.0, 6, dtype=np.float32)
    short = np.linspace(1.0, 1.5, 6, dtype=np.float32)
    spec = TinySpec(
        arch="phi3",
        num_kv_heads=4,
        extra_metadata={
            "phi3.rope.dimension_count": 12,
            "phi3.rope.scaling.original_context_length": 64,
            "phi3.rope.scaling.attn_factor": 1.25,
        },
    )
    extra = {"rope_factors_long.weight": long, "rope_factors_short.weight": short}
    tiny = write_tiny_gguf(tmp_path / "tiny.gguf", spec, extra_tensors=extra)
    _, config, weights = _load(tiny)
    rope = config.rope_parameters
    assert rope["rope_type"] == "longrope"
    assert rope["original_max_position_embeddings"] == 64
    assert rope["attention_factor"] == 1.25
    assert rope["long_factor"] == pytest.approx(long.tolist())
    assert rope["short_factor"] == pytest.approx(short.tolist())
    assert config.partial_rotary_factor == 0.75  # 12 of head_dim 16
    assert not any("rope_factors" in name for name in weights)
