"""The one-token AWQ GEMV for long rows (``engine_awq.wide``; Triton's interpreter on a
CPU, the real kernel on a GPU): equal to the dequantized-weight product for group sizes
32 / 64 / 128, a last step of masked chunks and a last column tile cut short (every chunk
and column reaching the output: ``test_awq_rows.py``); float32
exact to summation; the add+RMSNorm and gated launches equal the unfused kernels; the row
GEMV sends one-token calls on rows of ``WIDE_MIN_K`` or more here and others not."""

from __future__ import annotations

import pytest
import torch
from engine_awq import wide
from engine_awq.rows import RowsTile, awq_rows, awq_rows_add_rms_norm
from engine_awq.wide import WideTile
from engine_sdk.layers import fused_ops
from test_awq_rows import _norm_inputs, _want, check_gated
from test_awq_w4a16 import TOLERANCE, _rel_err, _tiled, _x

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"

# (K, N, group, tile): K 640 = 5 chunks in steps of 2 or 4 (masked chunks in the last
# step), N 72 / 40 not a multiple of the columns a program, groups of 32 and 64 put 4 and
# 2 groups in a chunk; 4096 activations a step is more than the row (one step)
WIDE_CASES = [
    (640, 72, 128, WideTile(8, 256)),
    (640, 40, 32, WideTile(4, 512)),
    (384, 40, 64, WideTile(16, 128)),
    (512, 24, 128, WideTile()),
]


@pytest.mark.parametrize(("k", "n", "group", "tile"), WIDE_CASES)
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=str)
def test_wide_equals_the_dequantized_reference(
    k: int, n: int, group: int, tile: WideTile, dtype: torch.dtype
) -> None:
    qweight, zeros, scales, chunk, reference = _tiled(k, n, group, seed=k + n)
    x = _x(1, k, dtype, seed=k)
    bias = torch.randn(n, generator=torch.Generator().manual_seed(3)).to(DEVICE, dtype)
    for b in (None, bias):
        out = awq_rows(x, qweight, zeros, scales, group, chunk, b, tile)
        assert out.shape == (1, n) and out.dtype == dtype
        assert _rel_err(out, _want(x, reference, b)) <= TOLERANCE[dtype]


def test_float32_is_exact_to_summation() -> None:
    """The subnormal codes and the folded zero points lose nothing but float32 sums."""
    if DEVICE != "cpu":
        pytest.skip("the interpreter's float32 check")
    qweight, zeros, scales, chunk, reference = _tiled(640, 72, 32, seed=4)
    for scale in (1.0, 1e-12, 1e8):  # activations far from 1 stay inside the exact range
        x = _x(1, 640, torch.float32) * scale
        out = awq_rows(x, qweight, zeros, scales, 32, chunk, tile=WideTile(8, 256))
        assert _rel_err(out, _want(x, reference, None)) <= 1e-6, scale


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=str)
def test_add_rms_norm_equals_norm_then_wide(dtype: torch.dtype) -> None:
    """The new residual is exactly ``x + residual``; the output is the add+norm kernel's
    rows through the plain launch (every step normalizes with the whole row's norm)."""
    qweight, zeros, scales, chunk, reference = _tiled(640, 72, 128)
    x, residual, weight = _norm_inputs(1, 640, dtype)
    bias = torch.randn(72, generator=torch.Generator().manual_seed(2)).to(DEVICE, dtype)
    out, new_residual = awq_rows_add_rms_norm(
        x, residual, weight, 1e-6, qweight, zeros, scales, 128, chunk, bias,
        tile=WideTile(8, 256),
    )  # fmt: skip
    normed, summed = fused_ops.add_rms_norm(x, residual, weight, 1e-6)
    assert torch.equal(new_residual, summed)
    assert _rel_err(out, _want(normed, reference, bias)) <= TOLERANCE[dtype]
    unfused = awq_rows(normed, qweight, zeros, scales, 128, chunk, bias, RowsTile())
    assert _rel_err(out, unfused) <= TOLERANCE[dtype] / 4


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=str)
def test_gated_equals_norm_wide_then_silu(dtype: torch.dtype) -> None:
    """``silu(gate) * up`` of the unfused launches (``check_gated``)."""
    check_gated(1, dtype, WideTile(8, 128))


def test_reads_strided_views() -> None:
    """A layer viewing its columns of merged scales / zero points reads the right ones."""
    qweight, zeros, scales, chunk, reference = _tiled(384, 96, 128)
    cols = slice(32, 96)
    x = _x(1, 384, torch.float16)
    out = awq_rows(x, qweight[cols], zeros[:, cols], scales[:, cols], 128, chunk, None, WideTile())
    assert _rel_err(out, _want(x, reference[:, cols], None)) <= TOLERANCE[torch.float16]


def test_long_rows_of_one_token_take_it(monkeypatch: pytest.MonkeyPatch) -> None:
    """The row GEMV hands one token over ``WIDE_MIN_K`` activations (128-row chunks) to
    this kernel with the tile ``wide_tile`` gives, and keeps two tokens, shorter rows,
    ``ENGINE_AWQ_WIDE_MIN_K=0`` and launches ``wide_tile`` declines."""
    assert wide.takes_wide(1, 4096, 128) and not wide.takes_wide(2, 4096, 128)
    assert not wide.takes_wide(1, 2048, 128) and not wide.takes_wide(1, 4096, 64)
    monkeypatch.setattr(wide, "WIDE_MIN_K", 256)
    asked: list[tuple] = []
    tiles = {"plain": WideTile(8, 256), "gated": None}
    monkeypatch.setattr(wide, "wide_tile", lambda *a: asked.append(a[1:]) or tiles[a[1]])
    launched: list[WideTile] = []
    real = wide.awq_wide
    monkeypatch.setattr(wide, "awq_wide", lambda *a: launched.append(a[-1]) or real(*a))
    qweight, zeros, scales, chunk, reference = _tiled(384, 40, 128, seed=9)
    x = _x(1, 384, torch.float16)
    out = awq_rows(x, qweight, zeros, scales, 128, chunk)
    assert _rel_err(out, _want(x, reference, None)) <= TOLERANCE[torch.float16]
    assert asked == [("plain", 40, 384)] and launched == [WideTile(8, 256)]
    x2, residual, weight = _norm_inputs(1, 384, torch.float16)
    awq_rows_add_rms_norm(
        x2, residual, weight, 1e-6, qweight, zeros, scales, 128, chunk, gated=True
    )
    assert asked[-1] == ("gated", 40, 384) and len(launched) == 1  # declined: the row GEMV
    awq_rows(_x(2, 384, torch.float16), qweight, zeros, scales, 128, chunk)
    monkeypatch.setattr(wide, "WIDE_MIN_K", 0)
    awq_rows(x, qweight, zeros, scales, 128, chunk)
    assert len(asked) == 2 and len(launched) == 1


def test_default_tiles(monkeypatch: pytest.MonkeyPatch) -> None:
    """Without a measured row: 8 columns over 4096 activations plain, 4 over 2048 with the
    prologue, none gated (the row GEMV); a measured ``awq_wide_*`` row wins, the gated
    launch's included."""
    cpu = torch.device("cpu")
    assert wide.wide_tile(cpu, "plain", 4096, 4096) == WideTile(8, 4096)
    assert wide.wide_tile(cpu, "norm", 6144, 4096) == WideTile(4, 2048)
    assert wide.wide_tile(cpu, "gated", 28672, 4096) is None
    found = {"block_n": 16, "block_k": 2048, "num_warps": 4}
    rows = ("awq_wide_norm_c128", "awq_wide_gated_c128")
    monkeypatch.setattr(wide, "tuned_config", lambda *a: found if a[1] in rows else None)
    assert wide.wide_tile(cpu, "norm", 6144, 4096) == WideTile(16, 2048)
    assert wide.wide_tile(cpu, "gated", 28672, 4096) == WideTile(16, 2048)
    assert wide.wide_tile(cpu, "plain", 6144, 4096) == WideTile(8, 4096)
