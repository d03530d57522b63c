"""AutoAWQ GEMM packing: the nibble order, round trips, and the reference dequantization."""

from __future__ import annotations

import pytest
import torch
from awq_formats import autoawq_pack, awq_gemm
from engine_awq.packing import (
    AWQ_ORDER,
    AWQ_REVERSE_ORDER,
    awq_dequantize,
    awq_quantize,
    pack_awq,
    unpack_awq,
)


def test_known_word() -> None:
    """Columns 0..7 holding the values 0..7: nibble i holds column AWQ_ORDER[i]."""
    values = torch.arange(8, dtype=torch.int32)[None, :]
    assert pack_awq(values).item() == 0x75316420
    assert autoawq_pack(values).item() == 0x75316420
    # Value 15 in column 7 lands in the top nibble: the int32 is negative.
    top = torch.zeros(1, 8, dtype=torch.int32)
    top[0, 7] = 15
    assert pack_awq(top).item() == -(2**28)  # 0xF0000000 as int32


def test_orders_are_inverse() -> None:
    assert [AWQ_ORDER[AWQ_REVERSE_ORDER[j]] for j in range(8)] == list(range(8))


def test_pack_matches_autoawq_loop_and_round_trips() -> None:
    values = torch.randint(0, 16, (24, 64), generator=torch.Generator().manual_seed(0))
    packed = pack_awq(values.to(torch.int32))
    assert torch.equal(packed, autoawq_pack(values))
    assert torch.equal(unpack_awq(packed), values.to(torch.int32))


def test_pack_rejects_bad_input() -> None:
    with pytest.raises(ValueError, match="multiple of 8"):
        pack_awq(torch.zeros(2, 12, dtype=torch.int32))
    with pytest.raises(ValueError, match="0..15"):
        pack_awq(torch.full((2, 8), 16, dtype=torch.int32))


@pytest.mark.parametrize("group_size", [32, 64])
def test_reference_dequantize_matches_the_format(group_size: int) -> None:
    weight = torch.randn(48, 128, generator=torch.Generator().manual_seed(1)) * 0.05
    fmt = awq_gemm(weight, group_size)
    t = fmt.tensors
    got = awq_dequantize(t["qweight"], t["qzeros"], t["scales"], group_size, torch.float32)
    assert got.shape == (128, 48)  # [in, out]
    assert torch.allclose(got.t(), fmt.dequantized, atol=1e-6)
    # 4-bit with 15 steps per group: error at most half a step.
    assert (got.t() - weight).abs().max() <= (t["scales"].float().max() / 2) + 1e-4


def test_engine_quantizer_produces_the_same_layout() -> None:
    weight = torch.randn(32, 64, generator=torch.Generator().manual_seed(2)) * 0.05
    qweight, qzeros, scales = awq_quantize(weight, 32)
    fmt = awq_gemm(weight, 32)
    assert torch.equal(scales, fmt.tensors["scales"])
    assert torch.equal(qzeros, fmt.tensors["qzeros"])
    assert torch.equal(qweight, fmt.tensors["qweight"])
