"""Tiny random models and random-weight PEFT adapters for the LoRA tests."""

from __future__ import annotations

from pathlib import Path

import pytest
from engine_sdk.testing.models import build_tiny_model
from lora_builders import build_adapter


@pytest.fixture(scope="session")
def qwen3_lora_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_tiny_model(tmp_path_factory.mktemp("qwen3"), "Qwen3ForCausalLM", seed=3)


@pytest.fixture(scope="session")
def adapters(qwen3_lora_model: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """Three adapters of different ranks and targets (one of them on q/v only)."""
    root = tmp_path_factory.mktemp("adapters")
    specs = {
        "alpha": (8, ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]),
        "beta": (4, ["q_proj", "v_proj"]),
        "gamma": (16, ["o_proj", "gate_proj", "up_proj", "down_proj", "k_proj"]),
    }
    return {
        name: build_adapter(qwen3_lora_model, root / name, rank, targets, seed=i + 10)
        for i, (name, (rank, targets)) in enumerate(specs.items())
    }
