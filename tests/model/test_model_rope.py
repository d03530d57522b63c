"""Rope frequencies equal transformers' for every supported rope type (bit for bit)."""

from __future__ import annotations

import pytest
import torch
from engine_sdk.layers.rotary import compute_inv_freq, rope_parameters_from_config

ROPES = [
    None,
    {"rope_type": "linear", "factor": 4.0},
    {
        "rope_type": "llama3",
        "factor": 8.0,
        "low_freq_factor": 1.0,
        "high_freq_factor": 4.0,
        "original_max_position_embeddings": 8192,
    },
    {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 32768},
    {
        "rope_type": "yarn",
        "factor": 40.0,
        "original_max_position_embeddings": 4096,
        "beta_fast": 32,
        "beta_slow": 1,
        "mscale": 1.0,
        "mscale_all_dim": 0.707,
    },
]


@pytest.mark.parametrize("rope", ROPES, ids=lambda r: (r or {}).get("rope_type", "default"))
def test_inv_freq_and_scaling_equal_transformers(rope: dict | None) -> None:
    from transformers import LlamaConfig
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    config = LlamaConfig(
        hidden_size=512,
        num_attention_heads=4,
        max_position_embeddings=131072,
        rope_theta=500000.0,
        rope_scaling=dict(rope) if rope else None,
    )
    params = rope_parameters_from_config(config, head_dim=128)
    ours, our_scale = compute_inv_freq(params)
    if rope is None:
        theirs = 1.0 / (500000.0 ** (torch.arange(0, 128, 2, dtype=torch.int64).float() / 128))
        their_scale = 1.0
    else:
        theirs, their_scale = ROPE_INIT_FUNCTIONS[rope["rope_type"]](config, torch.device("cpu"))
    assert torch.equal(ours, theirs)
    assert our_scale == pytest.approx(their_scale, rel=1e-12)


def test_legacy_rope_scaling_with_type_key() -> None:
    class Legacy:  # a transformers 4.x style config: rope_theta at the top, "type" key
        rope_theta = 1000.0
        rope_scaling = {"type": "linear", "factor": 2.0}
        max_position_embeddings = 128

    params = rope_parameters_from_config(Legacy(), head_dim=8)
    assert params.rope_type == "linear" and params.rope_theta == 1000.0
    inv, _ = compute_inv_freq(params)
    assert torch.allclose(inv, 1.0 / (1000.0 ** (torch.arange(0, 8, 2).float() / 8)) / 2)


def test_unsupported_rope_type_names_the_supported_ones() -> None:
    class Cfg:
        rope_parameters = {"rope_type": "su", "rope_theta": 1.0}

    with pytest.raises(ValueError, match="'su' is not supported; supported: default"):
        rope_parameters_from_config(Cfg(), head_dim=8)
