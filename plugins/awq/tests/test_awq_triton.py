"""The previous AWQ Triton kernel (checkpoint layout; kept as the benchmarks' baseline)
against the torch reference (Triton's interpreter on a CPU, the real kernel on a GPU)."""

from __future__ import annotations

import pytest
import torch
from awq_formats import awq_gemm
from engine_awq.packing import awq_dequantize
from engine_awq.triton_gemm import awq_gemm_triton, pick_block_k

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


def _packed(num_in: int, num_out: int, group_size: int, seed: int = 0) -> dict:
    weight = torch.randn(num_out, num_in, generator=torch.Generator().manual_seed(seed)) * 0.05
    return {k: v.to(DEVICE) for k, v in awq_gemm(weight, group_size).tensors.items()}


def _reference(x: torch.Tensor, t: dict, group_size: int) -> torch.Tensor:
    w = awq_dequantize(t["qweight"], t["qzeros"], t["scales"], group_size, torch.float32)
    return x.double() @ w.double()


@pytest.mark.parametrize(
    ("num_tokens", "num_in", "num_out", "group_size"),
    [(1, 128, 64, 32), (7, 256, 96, 64), (40, 128, 136, 128), (17, 64, 72, 64)],
)
@pytest.mark.parametrize("dtype", [torch.float16, torch.float32], ids=str)
def test_kernel_matches_reference(
    num_tokens: int, num_in: int, num_out: int, group_size: int, dtype: torch.dtype
) -> None:
    t = _packed(num_in, num_out, group_size)
    x = torch.randn(num_tokens, num_in, generator=torch.Generator().manual_seed(1)).to(
        DEVICE, dtype
    )
    out = awq_gemm_triton(x, t["qweight"], t["qzeros"], t["scales"], group_size)
    ref = _reference(x, t, group_size)
    assert out.shape == (num_tokens, num_out) and out.dtype == dtype
    tol = 1e-5 if dtype == torch.float32 and DEVICE == "cpu" else 1e-2
    assert (out.double().cpu() - ref.cpu()).abs().max() <= tol * ref.abs().max()


@pytest.mark.parametrize("split_k", [2, 3, 4])
def test_split_k_sums_every_part(split_k: int) -> None:
    t = _packed(256, 64, 32, seed=3)
    x = torch.randn(3, 256, generator=torch.Generator().manual_seed(4)).to(DEVICE)
    out = awq_gemm_triton(x, t["qweight"], t["qzeros"], t["scales"], 32, split_k=split_k)
    ref = _reference(x, t, 32)
    tol = 1e-4 if DEVICE == "cpu" else 5e-3  # float32 multiplies in TF32 on a GPU
    assert (out.double().cpu() - ref.cpu()).abs().max() <= tol * ref.abs().max()


def test_block_k_divides_group() -> None:
    assert [pick_block_k(g) for g in (128, 64, 32, 48, 8)] == [64, 64, 32, 16, None]
    t = _packed(64, 16, 32)
    with pytest.raises(ValueError, match="not a multiple of 16"):
        awq_gemm_triton(torch.zeros(1, 64), t["qweight"], t["qzeros"], t["scales"], 8)
