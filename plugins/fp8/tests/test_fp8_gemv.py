"""The split-K weight-only FP8 GEMV for decode batches (Triton's interpreter on a CPU, the
real kernel on a GPU): equal to the dequantized-weight product for 1 to 16 tokens, tensor /
channel / block scales, fp16 and bf16, odd shapes (K steps not a multiple of the split, a
partial last step, N not a multiple of the tile), both variants; every K part reaches the
output; the split-K counters return to zero, so a second call (a CUDA graph replay) is
right too."""

from __future__ import annotations

import pytest
import torch
from engine_fp8.gemv import MAX_TOKENS, GemvConfig, default_gemv_config, fp8_gemv
from engine_sdk.layers.split_k import split_k_locks
from test_fp8_w8a16 import TOLERANCE, _rel_err, _weights, _x

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"

# (tokens, K, N, config). K 200 leaves a partial last step; 5 steps of 64 over 3 parts
# (2 + 2 + 1); N 72 / 80 / 40 a partial column tile. Block scales are 32 x 64.
GEMV_CASES = [
    (1, 256, 64, GemvConfig("fma", 32, 64)),
    (1, 200, 72, GemvConfig("fma", 32, 32, split=3)),
    (1, 320, 40, GemvConfig("fma", 16, 64, num_stages=2, split=3)),
    (3, 200, 72, GemvConfig("fma", 16, 32, split=2)),
    (2, 320, 80, GemvConfig("dot", 32, 64, split=3)),
    (7, 256, 80, GemvConfig("dot", 32, 64, split=3)),
    (12, 200, 40, GemvConfig("dot", 16, 32, split=2)),
    (16, 192, 64, GemvConfig("dot", 16, 32)),
    (1, 200, 70, GemvConfig("fma", 2, 64, num_stages=1, split=1)),  # the bf16 GEMV's rows
    (3, 320, 36, GemvConfig("fma", 4, 64, split=1)),
]


def _want(x: torch.Tensor, dequantized: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    want = x.double().cpu() @ dequantized.double().cpu().t()
    return want if bias is None else want + bias.double().cpu()


@pytest.mark.parametrize(("num_tokens", "num_in", "num_out", "config"), GEMV_CASES)
@pytest.mark.parametrize("kind", ["tensor", "channel", "block"])
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=str)
def test_gemv_equals_dequantized_reference(
    kind: str, num_tokens: int, num_in: int, num_out: int, config: GemvConfig, dtype: torch.dtype
) -> None:
    q, scale, block, dequantized = _weights(kind, num_out, num_in)
    x = _x(num_tokens, num_in, dtype)
    bias = torch.randn(num_out, generator=torch.Generator().manual_seed(3)).to(DEVICE)
    out = fp8_gemv(x, q, scale, block, bias, config)
    assert out.shape == (num_tokens, num_out) and out.dtype == dtype
    assert _rel_err(out, _want(x, dequantized, bias)) <= TOLERANCE[dtype]


@pytest.mark.parametrize("num_tokens", range(1, MAX_TOKENS + 1))
@pytest.mark.parametrize("kind", ["channel", "block"])
def test_default_config_every_batch(num_tokens: int, kind: str) -> None:
    """What a layer runs: the default tile and split for every batch of 1 to 16 tokens."""
    q, scale, block, dequantized = _weights(kind, 72, 384, seed=num_tokens)
    x = _x(num_tokens, 384, torch.bfloat16, seed=num_tokens)
    out = fp8_gemv(x, q, scale, block)
    assert _rel_err(out, _want(x, dequantized, None)) <= TOLERANCE[torch.bfloat16]


@pytest.mark.parametrize("num_tokens", [1, 5])  # fma, dot
@pytest.mark.parametrize("kind", ["channel", "block"])
def test_every_k_part_reaches_the_output(num_tokens: int, kind: str) -> None:
    """One 64-column step per program (5 parts): activations that are zero outside one step
    must give exactly that step's product, for each step; a reduction that dropped or
    double-counted a part fails here."""
    q, scale, block, dequantized = _weights(kind, 48, 320, seed=3)
    config = default_gemv_config(num_tokens, 48, block)._replace(block_k=64, split=5)
    locks = split_k_locks(48, DEVICE)
    for step in range(5):
        x = torch.zeros(num_tokens, 320, dtype=torch.float16, device=DEVICE)
        x[:, step * 64 : (step + 1) * 64] = _x(num_tokens, 64, torch.float16, seed=step)
        out = fp8_gemv(x, q, scale, block, None, config, locks)
        want = _want(x, dequantized, None)
        assert want.abs().max() > 0
        assert _rel_err(out, want) <= TOLERANCE[torch.float16], step


def test_float32_is_exact_to_rounding() -> None:
    """Block scales that do not tile the weight (50 rows, 2 row blocks of 32) in float32:
    both variants add only summation error."""
    if DEVICE != "cpu":
        pytest.skip("float32 dots are TF32 on a GPU")
    from fp8_formats import per_block

    weight = torch.randn(50, 128, generator=torch.Generator().manual_seed(5)) * 0.05
    fmt = per_block(weight, (32, 32), "weight_scale_inv")
    q, scale = fmt.tensors["weight"], fmt.tensors["weight_scale_inv"]
    for num_tokens, config in ((1, GemvConfig("fma", 16, 32)), (5, GemvConfig("dot", 32, 32))):
        x = _x(num_tokens, 128, torch.float32)
        out = fp8_gemv(x, q, scale, (32, 32), None, config._replace(split=2))
        assert _rel_err(out, _want(x, fmt.dequantized, None)) <= 1e-6


def test_counters_return_to_zero_and_replays_agree() -> None:
    q, scale, block, dequantized = _weights("channel", 72, 320, seed=6)
    locks = split_k_locks(72, DEVICE)
    for num_tokens, variant in ((1, "fma"), (7, "dot")):
        x = _x(num_tokens, 320, torch.bfloat16)
        config = GemvConfig(variant, 16, 64, split=3)
        first = fp8_gemv(x, q, scale, block, None, config, locks)
        assert not locks.any()
        second = fp8_gemv(x, q, scale, block, None, config, locks)
        assert torch.equal(first, second) and not locks.any()
        assert _rel_err(first, _want(x, dequantized, None)) <= TOLERANCE[torch.bfloat16]


def test_default_config_fits_the_scale_block() -> None:
    assert default_gemv_config(1, 4096).block_k == 128
    assert default_gemv_config(8, 4096, (128, 128)).block_k == 128
    assert default_gemv_config(1, 4096, (128, 48)).block_k == 16
    assert default_gemv_config(1, 4096).variant == "fma"
    assert default_gemv_config(2, 4096).variant == "dot"


# (tokens, K, N, config): parts that each own a slice of the normalized row (200 over 3
# parts leaves a partial last step), both variants, and a row longer than one norm block
# at 4 tokens (K 1100: blocks of 1024).
NORM_CASES = [
    (1, 200, 72, GemvConfig("fma", 32, 32, split=3)),
    (2, 320, 80, GemvConfig("dot", 32, 64, split=3)),
    (3, 256, 40, GemvConfig("fma", 16, 32, split=2)),
    (4, 1100, 40, GemvConfig("fma", 16, 64, split=4)),
    (1, 256, 64, None),
]


@pytest.mark.parametrize(("num_tokens", "num_in", "num_out", "config"), NORM_CASES)
@pytest.mark.parametrize("kind", ["channel", "block"])
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=str)
def test_gemv_add_rms_norm_equals_norm_then_gemv(
    kind: str, num_tokens: int, num_in: int, num_out: int, config: GemvConfig | None,
    dtype: torch.dtype,
) -> None:  # fmt: skip
    """The fused residual add and RMSNorm: the new residual is exactly ``x + residual``,
    and the output equals the add+norm kernel's result through the GEMV; each split part
    normalizes its own K slice with the whole row's norm."""
    from engine_fp8.gemv import fp8_gemv_add_rms_norm
    from engine_sdk.layers import fused_ops

    q, scale, block, dequantized = _weights(kind, num_out, num_in)
    x = _x(num_tokens, num_in, dtype, seed=3) * 4
    residual = _x(num_tokens, num_in, dtype, seed=4)
    weight = (torch.rand(num_in, generator=torch.Generator().manual_seed(5)) + 0.5).to(DEVICE)
    weight = weight.to(dtype)
    bias = torch.randn(num_out, generator=torch.Generator().manual_seed(3)).to(DEVICE)
    if config is not None and block is not None and block[1] % config.block_k:
        config = config._replace(block_k=block[1])
    out, new_residual = fp8_gemv_add_rms_norm(
        x, residual, weight, 1e-6, q, scale, block, bias, config
    )
    normed, summed = fused_ops.add_rms_norm(x, residual, weight, 1e-6)  # the unfused kernel
    assert torch.equal(new_residual, summed)
    assert _rel_err(out, _want(normed, dequantized, bias)) <= TOLERANCE[dtype]
    unfused = fp8_gemv(normed, q, scale, block, bias, config)
    assert _rel_err(out, unfused) <= TOLERANCE[dtype] / 4


def test_norm_launch_takes_its_own_tuned_row(monkeypatch: pytest.MonkeyPatch) -> None:
    """The add+RMSNorm launch reads the ``fp8_norm`` row first, then the plain ``fp8`` row."""
    from engine_fp8 import gemv as gemv_mod

    rows = {
        "fp8": {"variant": "fma", "block_n": 2, "block_k": 1024, "split": 1, "ms": 0.1},
        "fp8_norm": {"variant": "fma", "block_n": 32, "block_k": 256, "split": 2},
    }
    asked: list[str] = []

    def fake(package, kernel, device, num_out, num_in, num_tokens):  # type: ignore[no-untyped-def]
        asked.append(kernel)
        return rows.get(kernel)

    monkeypatch.setattr(gemv_mod, "tuned_config", fake)
    dev = torch.device("cpu")
    assert gemv_mod.gemv_config(dev, 1, 4096, 1024) == GemvConfig("fma", 2, 1024, split=1)
    assert asked == ["fp8"]
    assert gemv_mod.gemv_config(dev, 1, 4096, 1024, norm=True) == GemvConfig(
        "fma", 32, 256, split=2
    )
    del rows["fp8_norm"]
    assert gemv_mod.gemv_config(dev, 1, 4096, 1024, norm=True).block_n == 2


@pytest.mark.parametrize("num_tokens", [1, 5])  # fma, dot
def test_launches_name_every_constexpr(num_tokens: int) -> None:
    """The default split-K launch (and its last-program merge) names every constexpr,
    defaults included, as torch.compile's launchers need (``engine_sdk.testing.launches``;
    Triton's interpreter, so CPU only)."""
    if DEVICE == "cuda":
        pytest.skip("records the interpreter's launches")
    from engine_sdk.testing.launches import recorded_launches

    q, scale, block, _ = _weights("channel", 72, 384, seed=num_tokens)
    x = _x(num_tokens, 384, torch.bfloat16, seed=num_tokens)
    with recorded_launches() as seen:
        fp8_gemv(x, q, scale, block)
    assert seen.kernels
    assert seen.unpassed == set(), seen.unpassed
