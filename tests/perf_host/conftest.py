"""Fixtures of the host-overhead tests: the front-end tests' tiny trained tokenizers."""

from __future__ import annotations

import os
import sys
from typing import Any

import pytest

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(__file__)), "frontend"))

from tokenizers_fixtures import byte_level_tokenizer, sentencepiece_tokenizer  # noqa: E402


@pytest.fixture(scope="session")
def byte_tokenizer() -> Any:
    return byte_level_tokenizer()


@pytest.fixture(scope="session")
def sp_tokenizer() -> Any:
    return sentencepiece_tokenizer()


@pytest.fixture(scope="session", params=["byte_level", "sentencepiece"])
def any_tokenizer(request: pytest.FixtureRequest, byte_tokenizer: Any, sp_tokenizer: Any) -> Any:
    return byte_tokenizer if request.param == "byte_level" else sp_tokenizer
