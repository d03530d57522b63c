"""engine_sdk.layers.split_k: how K is split, and the second pass that adds the parts
(Triton's interpreter on a CPU)."""

from __future__ import annotations

import pytest
import torch
from engine_sdk.layers.split_k import pick_split, reduce_split_k

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


@pytest.mark.parametrize(
    ("num_tiles", "num_steps", "target", "expected"),
    [
        (224, 32, 528, (3, 11)),  # 8B gate/up, one token: 3 parts of 11, 11, 10 steps
        (32, 112, 528, (16, 7)),  # 8B down: 17 wanted, 7 steps each makes 16 parts
        (1000, 32, 528, (1, 32)),  # enough tiles: no split
        (1, 5, 528, (5, 1)),  # never more parts than steps
        (8, 7, 16, (2, 4)),  # the last part is shorter, never empty
    ],
)
def test_pick_split(num_tiles: int, num_steps: int, target: int, expected: tuple[int, int]) -> None:
    split, per_split = pick_split(num_tiles, num_steps, target)
    assert (split, per_split) == expected
    assert (split - 1) * per_split < num_steps <= split * per_split


@pytest.mark.parametrize("bias", [False, True])
def test_reduce_adds_parts_bias_and_casts(bias: bool) -> None:
    gen = torch.Generator().manual_seed(0)
    partials = torch.randn(3, 5, 40, generator=gen).to(DEVICE)
    b = torch.randn(40, generator=gen).to(DEVICE, torch.float16) if bias else None
    out = reduce_split_k(partials, b, torch.float16)
    want = partials.double().sum(0) + (b.double() if b is not None else 0)
    assert out.dtype == torch.float16 and out.shape == (5, 40)
    torch.testing.assert_close(out.double(), want.to(out.device), rtol=1e-3, atol=1e-3)
