"""The split-K W4A16 GEMV for decode batches (Triton's interpreter on a CPU, the real kernel
on a GPU): equal to the dequantized-weight product for 1 to 16 tokens, group sizes 32 / 64
/ 128, fp16 and bf16, odd shapes (K chunks not a multiple of the split, N not a multiple
of the tile), both variants; every K part reaches the output; the split-K counters return
to zero, so a second call (a CUDA graph replay) is right too."""

from __future__ import annotations

import pytest
import torch
from engine_awq.gemv import MAX_TOKENS, GemvConfig, awq_gemv, default_gemv_config
from engine_awq.packing import awq_dequantize, pack_awq
from engine_awq.tiled import repack_tiled
from engine_sdk.layers.split_k import split_k_locks
from test_awq_w4a16 import TOLERANCE, _rel_err, _tiled, _x

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"

# (tokens, K, N, group, config). K / 128 chunks against the split: 384 = 3 chunks over 2
# parts (2 + 1), 640 = 5 over 3 (2 + 2 + 1); N 72 / 40 / 80 leave a partial column tile;
# group 32 and 64 put 4 and 2 groups in a chunk; K 96 / 192 get 32- / 64-row chunks.
GEMV_CASES = [
    (1, 512, 64, 128, GemvConfig("fma", 32)),
    (1, 384, 72, 128, GemvConfig("fma", 32, split=2)),
    (1, 640, 40, 32, GemvConfig("fma", 16, split=3)),
    (1, 96, 24, 32, GemvConfig("fma", 16, split=3)),
    (2, 384, 72, 64, GemvConfig("fma", 16, split=2)),
    (3, 640, 48, 128, GemvConfig("fma", 32, num_warps=2, split=3)),
    (4, 192, 40, 64, GemvConfig("fma", 16, split=2)),
    (2, 384, 72, 64, GemvConfig("dot", 32, split=2)),
    (5, 640, 80, 32, GemvConfig("dot", 16, split=3)),
    (8, 512, 72, 128, GemvConfig("dot", 64, num_stages=2, split=4)),
    (13, 384, 40, 64, GemvConfig("dot", 32, split=2)),
    (16, 256, 64, 128, GemvConfig("dot", 32)),
    (11, 192, 40, 64, None),  # 64-row chunks: the fma variant with 16 rows
]


def _bias(num_out: int) -> torch.Tensor:
    return torch.randn(num_out, generator=torch.Generator().manual_seed(2)).to(DEVICE)


def _want(x: torch.Tensor, reference: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    want = x.double().cpu() @ reference.double().cpu()
    return want if bias is None else want + bias.double().cpu()


@pytest.mark.parametrize(("num_tokens", "num_in", "num_out", "group_size", "config"), GEMV_CASES)
@pytest.mark.parametrize("bias", [False, True])
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=str)
def test_gemv_equals_dequantized_reference(
    num_tokens: int,
    num_in: int,
    num_out: int,
    group_size: int,
    config: GemvConfig | None,
    bias: bool,
    dtype: torch.dtype,
) -> None:
    qweight, zeros, scales, chunk, reference = _tiled(num_in, num_out, group_size)
    x = _x(num_tokens, num_in, dtype)
    b = _bias(num_out) if bias else None
    out = awq_gemv(x, qweight, zeros, scales, group_size, chunk, b, config)
    assert out.shape == (num_tokens, num_out) and out.dtype == dtype
    assert _rel_err(out, _want(x, reference, b)) <= TOLERANCE[dtype]


@pytest.mark.parametrize("num_tokens", range(1, MAX_TOKENS + 1))
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=str)
def test_default_config_every_batch(num_tokens: int, dtype: torch.dtype) -> None:
    """What a layer runs: the default tile and split (on a CPU the interpreter pretends 4
    multiprocessors, so 3 chunks split 3 ways) for every batch of 1 to 16 tokens."""
    qweight, zeros, scales, chunk, reference = _tiled(384, 72, 64, seed=num_tokens)
    x = _x(num_tokens, 384, dtype, seed=num_tokens)
    out = awq_gemv(x, qweight, zeros, scales, 64, chunk)
    assert _rel_err(out, _want(x, reference, None)) <= TOLERANCE[dtype]


@pytest.mark.parametrize("num_tokens", [1, 5])  # fma, dot
def test_every_k_part_reaches_the_output(num_tokens: int) -> None:
    """One chunk per program (5 parts): activations that are zero outside one chunk must
    give exactly that chunk's product, for each chunk; a reduction that dropped or
    double-counted a part fails here."""
    qweight, zeros, scales, chunk, reference = _tiled(640, 48, 128, seed=3)
    config = default_gemv_config(num_tokens, 48, chunk)._replace(split=5)
    locks = split_k_locks(48, DEVICE)
    for c in range(640 // chunk):
        x = torch.zeros(num_tokens, 640, dtype=torch.float16, device=DEVICE)
        x[:, c * chunk : (c + 1) * chunk] = _x(num_tokens, chunk, torch.float16, seed=c)
        out = awq_gemv(x, qweight, zeros, scales, 128, chunk, None, config, locks)
        want = _want(x, reference, None)
        assert want.abs().max() > 0
        assert _rel_err(out, want) <= TOLERANCE[torch.float16], c


def test_float32_is_exact_to_rounding() -> None:
    """In float32 (interpreter) both variants add only summation error: the codes and
    zero points are exact, the scale multiplies once per group slice."""
    if DEVICE != "cpu":
        pytest.skip("float32 dots are TF32 on a GPU")
    qweight, zeros, scales, chunk, reference = _tiled(640, 72, 32, seed=4)
    for num_tokens, config in ((1, GemvConfig("fma", 32, split=2)), (6, GemvConfig("dot", 32))):
        x = _x(num_tokens, 640, torch.float32)
        out = awq_gemv(x, qweight, zeros, scales, 32, chunk, None, config)
        assert _rel_err(out, _want(x, reference, None)) <= 1e-6


def test_one_token_extreme_codes_zeros_and_activations() -> None:
    """The one-token path's bit tricks at their edges: codes 0 and 15 against zero points 0
    and 15 in every nibble position (the high nibbles, read from ``words >> 12``, included)
    and activations from 1e-4 to 3e4 in one row, exact to float32 summation (interpreter)
    or to the output's rounding (GPU)."""
    num_in, num_out, group_size = 256, 32, 128
    gen = torch.Generator().manual_seed(9)
    codes = torch.randint(0, 2, (num_in, num_out), generator=gen) * 15  # only 0 and 15
    codes[:, :4] = 15  # whole columns of 15 ...
    codes[:, 4:8] = 0  # ... and of 0
    zeros = torch.tensor([0, 15] * (num_out // 2))[None, :].repeat(num_in // group_size, 1)
    scales = torch.rand(num_in // group_size, num_out, generator=gen).half() + 0.5
    qweight, qzeros = pack_awq(codes), pack_awq(zeros)
    reference = awq_dequantize(qweight, qzeros, scales, group_size, torch.float32)
    tiled, tiled_zeros = repack_tiled(qweight, qzeros, 128)
    magnitudes = 10.0 ** torch.linspace(-4, 4.5, num_in)
    signs = torch.where(torch.rand(num_in, generator=gen) < 0.5, -1.0, 1.0)
    for dtype, tolerance in ((torch.float32, 1e-6), (torch.bfloat16, TOLERANCE[torch.bfloat16])):
        if dtype == torch.float32 and DEVICE != "cpu":
            continue  # float32 is the interpreter's exactness check
        x = (magnitudes * signs)[None, :].to(DEVICE, dtype)
        out = awq_gemv(
            x, tiled.to(DEVICE), tiled_zeros.to(DEVICE), scales.to(DEVICE), group_size, 128,
            None, GemvConfig("fma", 16, split=2),
        )  # fmt: skip
        want = _want(x, reference, None)
        assert want.abs().max() > 1e4
        assert _rel_err(out, want) <= tolerance, dtype


def test_counters_return_to_zero_and_replays_agree() -> None:
    """The layer's counters are zero after a call, and a second call with them (what a
    CUDA graph replay does) gives the same bits."""
    qweight, zeros, scales, chunk, reference = _tiled(640, 72, 64, seed=5)
    locks = split_k_locks(72, DEVICE)
    for num_tokens, variant in ((1, "fma"), (7, "dot")):
        x = _x(num_tokens, 640, torch.bfloat16)
        config = GemvConfig(variant, 16, split=3)
        first = awq_gemv(x, qweight, zeros, scales, 64, chunk, None, config, locks)
        assert not locks.any()
        second = awq_gemv(x, qweight, zeros, scales, 64, chunk, None, config, locks)
        assert torch.equal(first, second) and not locks.any()
        assert _rel_err(first, _want(x, reference, None)) <= TOLERANCE[torch.bfloat16]


def test_reads_strided_views() -> None:
    """A layer viewing its columns of merged scales / zero points (strided rows) and its
    row block of the merged words reads the right ones."""
    qweight, zeros, scales, chunk, reference = _tiled(384, 96, 128)
    cols = slice(32, 96)
    assert not scales[:, cols].is_contiguous()
    for num_tokens in (1, 9):
        x = _x(num_tokens, 384, torch.float16)
        out = awq_gemv(x, qweight[cols], zeros[:, cols], scales[:, cols], 128, chunk)
        assert _rel_err(out, _want(x, reference[:, cols], None)) <= TOLERANCE[torch.float16]


def test_refuses_what_it_cannot_run() -> None:
    qweight, zeros, scales, chunk, _ = _tiled(192, 40, 64)  # 64-row chunks
    with pytest.raises(AssertionError, match="1 to 16 rows"):
        awq_gemv(_x(17, 192, torch.float16), qweight, zeros, scales, 64, chunk)
    with pytest.raises(AssertionError, match="chunk 128"):
        awq_gemv(_x(4, 192, torch.float16), qweight, zeros, scales, 64, chunk,
                 config=GemvConfig("dot", 16))  # fmt: skip


# (tokens, K, N, group, config): split parts that each own a slice of the normalized row
# (384 = 3 chunks over 2 parts, 640 = 5 over 3), both variants, 64-row chunks, and a row
# longer than one norm block at 4 tokens (K 1152: blocks of 1024).
NORM_CASES = [
    (1, 384, 72, 128, GemvConfig("fma", 32, split=2)),
    (1, 640, 40, 32, GemvConfig("fma", 16, split=3)),
    (2, 384, 72, 64, GemvConfig("dot", 32, split=2)),
    (3, 640, 48, 128, GemvConfig("fma", 32, num_warps=2, split=3)),
    (4, 1152, 40, 128, GemvConfig("fma", 16, split=4)),
    (1, 192, 40, 64, None),
]


@pytest.mark.parametrize(("num_tokens", "num_in", "num_out", "group_size", "config"), NORM_CASES)
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=str)
def test_gemv_add_rms_norm_equals_norm_then_gemv(
    num_tokens: int,
    num_in: int,
    num_out: int,
    group_size: int,
    config: GemvConfig | None,
    dtype: torch.dtype,
) -> None:
    """The fused residual add and RMSNorm: the new residual is exactly ``x + residual``,
    and the output equals the add+norm kernel's result through the GEMV. Each split part
    normalizes its own K slice with the whole row's norm: a slice normalized with a partial
    sum of squares, or a part left unnormalized, breaks the comparison."""
    from engine_awq.gemv import awq_gemv_add_rms_norm
    from engine_sdk.layers import fused_ops

    qweight, zeros, scales, chunk, reference = _tiled(num_in, num_out, group_size)
    x = _x(num_tokens, num_in, dtype, seed=3) * 4
    residual = _x(num_tokens, num_in, dtype, seed=4)
    weight = (torch.rand(num_in, generator=torch.Generator().manual_seed(5)) + 0.5).to(dtype)
    weight = weight.to(DEVICE)
    b = _bias(num_out)
    out, new_residual = awq_gemv_add_rms_norm(
        x, residual, weight, 1e-6, qweight, zeros, scales, group_size, chunk, b, config
    )
    normed, summed = fused_ops.add_rms_norm(x, residual, weight, 1e-6)  # the unfused kernel
    assert torch.equal(new_residual, summed)
    assert new_residual.data_ptr() != residual.data_ptr()
    assert _rel_err(out, _want(normed, reference, b)) <= TOLERANCE[dtype]
    unfused = awq_gemv(normed, qweight, zeros, scales, group_size, chunk, b, config)
    assert _rel_err(out, unfused.double().cpu()) <= TOLERANCE[dtype] / 4


@pytest.mark.parametrize("num_tokens", [1, 5])  # fma, dot
def test_launches_name_every_constexpr(num_tokens: int) -> None:
    """The default split-K launch names every constexpr, defaults included, as
    torch.compile's launchers need (``engine_sdk.testing.launches``; Triton's interpreter,
    so CPU only)."""
    if DEVICE == "cuda":
        pytest.skip("records the interpreter's launches")
    from engine_sdk.testing.launches import recorded_launches

    qweight, zeros, scales, chunk, _ = _tiled(384, 72, 64, seed=num_tokens)
    x = _x(num_tokens, 384, torch.bfloat16, seed=num_tokens)
    with recorded_launches() as seen:
        awq_gemv(x, qweight, zeros, scales, 64, chunk)
    assert seen.kernels
    assert seen.unpassed == set(), seen.unpassed
