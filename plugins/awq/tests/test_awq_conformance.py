"""The AWQ method through the SDK quantization conformance suite (torch reference path)."""

from __future__ import annotations

import pytest
import torch
from awq_formats import awq_gemm
from engine_awq.config import AwqConfig
from engine_sdk.testing.quantization import QUANT_CASES, QuantCase, run_quantization_case

CONFIG = {"quant_method": "awq", "bits": 4, "zero_point": True, "version": "gemm"}


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16], ids=str)
@pytest.mark.parametrize("case", QUANT_CASES, ids=lambda c: c.name)
@pytest.mark.parametrize("group_size", [32, 64])
def test_reference_path_conforms(group_size: int, case: QuantCase, dtype: torch.dtype) -> None:
    run_quantization_case(
        AwqConfig,
        {**CONFIG, "group_size": group_size},
        case,
        quantizer=lambda w: awq_gemm(w, group_size),
        dtype=dtype,
        weight_rtol=0.15,
    )


def test_one_group_per_column() -> None:
    """group_size -1: one scale and zero per output column over the whole input."""
    case = QUANT_CASES[1]
    run_quantization_case(
        AwqConfig,
        {**CONFIG, "group_size": -1},
        case,
        quantizer=lambda w: awq_gemm(w, case.input_size),
        weight_rtol=0.3,
    )


def test_suite_catches_swapped_nibble_order() -> None:
    """Packing in plain order (0..7) instead of AutoAWQ's must fail the suite."""

    def plain_order(w: torch.Tensor):  # type: ignore[no-untyped-def]
        fmt = awq_gemm(w, 32)
        q = fmt.tensors["qweight"].to(torch.int64) & 0xFFFFFFFF
        nibbles = [(q >> (4 * i)) & 0xF for i in range(8)]
        # nibble i holds column ORDER[i]; rebuild with nibble j holding column j.
        order = [0, 2, 4, 6, 1, 3, 5, 7]
        by_column = {order[i]: nibbles[i] for i in range(8)}
        plain = sum(by_column[j] << (4 * j) for j in range(8))
        plain = torch.where(plain >= 2**31, plain - 2**32, plain).to(torch.int32)
        return type(fmt)(dict(fmt.tensors, qweight=plain), fmt.dequantized)

    with pytest.raises(AssertionError):
        run_quantization_case(
            AwqConfig, {**CONFIG, "group_size": 32}, QUANT_CASES[1], quantizer=plain_order
        )
