"""Rope scaling read from GGUF metadata and from Llama 3's ``rope_freqs.weight`` tensor."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest
import torch
from engine_gguf.format import GGUFFormat
from engine_gguf.rope import llama3_rope_parameters
from gguf_builders import TinySpec, write_tiny_gguf
from transformers import LlamaConfig
from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS


def convert_script_divisors(head_dim, base, factor, low, high, old_context) -> np.ndarray:
    """llama.cpp convert_hf_to_gguf.py's Llama 3 ``rope_factors`` loop, verbatim in spirit."""
    freqs = 1.0 / (base ** (torch.arange(0, head_dim, 2, dtype=torch.float32) / head_dim))
    low_wavelen, high_wavelen = old_context / low, old_context / high
    out = []
    for freq in freqs.tolist():
        wavelen = 2 * math.pi / freq
        if wavelen < high_wavelen:
            out.append(1.0)
        elif wavelen > low_wavelen:
            out.append(factor)
        else:
            smooth = (old_context / wavelen - low) / (high - low)
            out.append(1 / ((1 - smooth) / factor + smooth))
    return np.array(out, dtype=np.float32)


@pytest.mark.parametrize("factor, low, high", [(8.0, 1.0, 4.0), (32.0, 1.0, 4.0), (16.0, 2.0, 8.0)])
def test_llama3_parameters_recovered_and_match_transformers(factor, low, high) -> None:
    head_dim, theta = 128, 500000.0
    divisors = convert_script_divisors(head_dim, theta, factor, low, high, 8192)
    params = llama3_rope_parameters(divisors, head_dim, theta)
    assert params["rope_type"] == "llama3"
    assert params["factor"] == factor
    assert params["low_freq_factor"] == pytest.approx(low, abs=1e-3)
    assert params["high_freq_factor"] == pytest.approx(high, abs=1e-3)
    assert params["original_max_position_embeddings"] == 8192
    # transformers' llama3 frequencies equal llama.cpp's: base frequencies / divisors.
    config = LlamaConfig(
        hidden_size=head_dim * 2, num_attention_heads=2, head_dim=head_dim, rope_parameters=params
    )
    inv_freq, _ = ROPE_INIT_FUNCTIONS["llama3"](config, "cpu")
    base = 1.0 / (theta ** (np.arange(0, head_dim, 2, dtype=np.float64) / head_dim))
    np.testing.assert_allclose(inv_freq.double().numpy(), base / divisors, rtol=1e-4)


def test_rope_freqs_that_are_not_llama3_are_rejected() -> None:
    divisors = np.linspace(1.0, 5.0, 64).astype(np.float32)  # linear in index, not in freq
    with pytest.raises(ValueError, match="does not follow Llama 3 rope scaling"):
        llama3_rope_parameters(divisors, 128, 500000.0)


def test_tiny_gguf_with_rope_freqs_tensor(tmp_path: Path) -> None:
    divisors = convert_script_divisors(16, 10000.0, 8.0, 1.0, 4.0, 8192)
    tiny = write_tiny_gguf(
        tmp_path / "tiny.gguf", TinySpec(), extra_tensors={"rope_freqs.weight": divisors}
    )
    fmt = GGUFFormat(tiny.path)
    params = fmt.load_config().rope_parameters
    assert params["rope_type"] == "llama3" and params["factor"] == 8.0
    assert "rope_freqs.weight" not in dict(fmt.iter_weights(torch.float32))
    assert set(dict(fmt.iter_weights(torch.float32))) == set(tiny.expected)


@pytest.mark.parametrize(
    "metadata, expected",
    [
        (
            {"llama.rope.scaling.type": "linear", "llama.rope.scaling.factor": 2.0},
            {"rope_type": "linear", "factor": 2.0, "rope_theta": 10000.0},
        ),
        (
            {
                "llama.rope.scaling.type": "yarn",
                "llama.rope.scaling.factor": 4.0,
                "llama.rope.scaling.original_context_length": 4096,
            },
            {
                "rope_type": "yarn",
                "factor": 4.0,
                "original_max_position_embeddings": 4096,
                "rope_theta": 10000.0,
            },
        ),
        ({"llama.rope.scaling.type": "none"}, {"rope_type": "default", "rope_theta": 10000.0}),
    ],
    ids=["linear", "yarn", "none"],
)
def test_rope_scaling_metadata(tmp_path: Path, metadata, expected) -> None:
    tiny = write_tiny_gguf(tmp_path / "tiny.gguf", TinySpec(extra_metadata=metadata))
    assert GGUFFormat(tiny.path).load_config().rope_parameters == expected


def test_unsupported_rope_scaling_is_a_clear_error(tmp_path: Path) -> None:
    metadata = {"llama.rope.scaling.type": "longrope", "llama.rope.scaling.factor": 4.0}
    tiny = write_tiny_gguf(tmp_path / "tiny.gguf", TinySpec(extra_metadata=metadata))
    with pytest.raises(ValueError, match="'longrope' is not supported"):
        GGUFFormat(tiny.path).load_config()
