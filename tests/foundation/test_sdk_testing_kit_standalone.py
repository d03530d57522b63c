"""The SDK's testing kit needs ``engine-sdk`` alone: its dense test attention passes the
SDK's attention conformance cases, and the quantized-model kit imports no plugin."""

from __future__ import annotations

import subprocess
import sys

import pytest
from engine_sdk.testing.attention import (
    ATTENTION_CASES,
    MODEL_FEATURE_ATTENTION_CASES,
    run_attention_case,
    run_feature_case,
)
from engine_sdk.testing.dense_attention import DenseAttentionBackend


@pytest.mark.parametrize("case", ATTENTION_CASES, ids=lambda c: c.name)
def test_dense_attention_passes_the_conformance_cases(case) -> None:
    run_attention_case(DenseAttentionBackend, case)


@pytest.mark.parametrize("case", MODEL_FEATURE_ATTENTION_CASES, ids=lambda c: c.name)
def test_dense_attention_computes_the_model_feature_cases(case) -> None:
    assert run_feature_case(DenseAttentionBackend, case) is None


def test_quantized_model_kit_imports_no_plugin() -> None:
    code = (
        "import sys, engine_sdk.testing.quantized_model as m\n"
        "m.build_model, m.greedy\n"
        "bad = sorted(n for n in sys.modules if n.startswith('engine_') and n != 'engine_sdk'"
        " and not n.startswith('engine_sdk.'))\n"
        "print(','.join(bad))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == ""
