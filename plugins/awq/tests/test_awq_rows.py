"""The AWQ row GEMV (``engine_awq.rows``; Triton's interpreter on a CPU, the real kernel on
a GPU): equal to the dequantized-weight product for 1 to 4 rows, group sizes 32 / 64 / 128,
64- and 32-row chunks, a last step with masked chunks and a last column tile cut short;
with the add+RMSNorm prologue equal to the decoder's add+norm kernel then the plain
launch, and gated equal to that then the SiLU kernel; the method sends one-token calls
there (``ENGINE_AWQ_ROW_GEMV=0`` back to the split-K GEMV), leaves the norm of rows past
``ROWS_FUSE_NORM_MAX_K`` to the decoder, and a tiny Qwen3 decode row takes the fused
launches (or, past the limit, the plain ones) with the logits of the checkpoint layout."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch
from engine_awq import method as awq_method
from engine_awq import rows
from engine_awq.rows import ROWS_MAX_TOKENS, RowsTile, awq_rows, awq_rows_add_rms_norm
from engine_awq.wide import WideTile
from engine_sdk.layers import fused_ops
from test_awq_w4a16 import TOLERANCE, _rel_err, _tiled, _x

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"

# (tokens, K, N, group, tile): K 640 = 5 chunks in steps of 2 (the last step
# has one masked chunk), N 72 / 40 not a multiple of the columns a program, group 32
# and 64 put 4 and 2 groups in a chunk, K 96 / 192 get 32- / 64-row chunks, block_k 4096
# more than the row (one step, chunks masked); warps and stages (ignored by the
# interpreter) compile other kernels on a GPU.
ROWS_CASES = [
    (1, 512, 64, 128, None),
    (1, 640, 72, 128, RowsTile(4, 256)),
    (1, 640, 40, 32, RowsTile(2, 256, 2, 1)),
    (2, 384, 40, 64, RowsTile(16, 128)),
    (3, 96, 24, 32, RowsTile(1, 2048, 8, 3)),
    (4, 192, 40, 64, RowsTile(8, 4096)),
]


def _want(x: torch.Tensor, reference: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    want = x.double().cpu() @ reference.double().cpu()
    return want if bias is None else want + bias.double().cpu()


@pytest.mark.parametrize(("tokens", "k", "n", "group", "tile"), ROWS_CASES)
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=str)
def test_rows_equal_the_dequantized_reference(
    tokens: int, k: int, n: int, group: int, tile: RowsTile | None, dtype: torch.dtype
) -> None:
    qweight, zeros, scales, chunk, reference = _tiled(k, n, group, seed=tokens)
    x = _x(tokens, k, dtype, seed=k)
    bias = torch.randn(n, generator=torch.Generator().manual_seed(3)).to(DEVICE, dtype)
    for b in (None, bias):
        out = awq_rows(x, qweight, zeros, scales, group, chunk, b, tile)
        assert out.shape == (tokens, n) and out.dtype == dtype
        assert _rel_err(out, _want(x, reference, b)) <= TOLERANCE[dtype]


def test_float32_is_exact_to_rounding() -> None:
    """Codes and zero points are exact; only summation error in float32 (interpreter)."""
    if DEVICE != "cpu":
        pytest.skip("the interpreter's float32 check")
    qweight, zeros, scales, chunk, reference = _tiled(640, 72, 32, seed=4)
    for tokens in (1, 3):
        x = _x(tokens, 640, torch.float32)
        out = awq_rows(x, qweight, zeros, scales, 32, chunk, tile=RowsTile(4, 256))
        assert _rel_err(out, _want(x, reference, None)) <= 1e-6


@pytest.mark.parametrize("tile", [RowsTile(16, 256), WideTile(16, 256)], ids=["rows", "wide"])
def test_every_chunk_and_column_reaches_the_output(tile: RowsTile | WideTile) -> None:
    """Activations that are zero outside one chunk give exactly that chunk's product, for
    every chunk (a step that skipped or repeated chunks fails), in every column; for the
    row GEMV and the wide one (``engine_awq.wide``)."""
    qweight, zeros, scales, chunk, reference = _tiled(640, 40, 128, seed=6)
    for c in range(640 // chunk):
        x = torch.zeros(1, 640, dtype=torch.float16, device=DEVICE)
        x[:, c * chunk : (c + 1) * chunk] = _x(1, chunk, torch.float16, seed=c)
        out = awq_rows(x, qweight, zeros, scales, 128, chunk, tile=tile)
        want = _want(x, reference, None)
        assert (want.abs() > 0).all()
        assert _rel_err(out, want) <= TOLERANCE[torch.float16], c


def _norm_inputs(tokens: int, k: int, dtype: torch.dtype) -> tuple[torch.Tensor, ...]:
    x = _x(tokens, k, dtype, seed=3) * 4
    residual = _x(tokens, k, dtype, seed=4)
    weight = (torch.rand(k, generator=torch.Generator().manual_seed(5)) + 0.5).to(DEVICE, dtype)
    return x, residual, weight


@pytest.mark.parametrize(("tokens", "k", "n", "group"), [(1, 640, 72, 128), (3, 384, 40, 64)])
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=str)
def test_add_rms_norm_equals_norm_then_rows(
    tokens: int, k: int, n: int, group: int, dtype: torch.dtype
) -> None:
    """The new residual is exactly ``x + residual``; the output is the add+norm kernel's
    normalized rows through the plain launch (each step normalizes its slice with the
    whole row's norm: a partial norm or an unnormalized step fails)."""
    qweight, zeros, scales, chunk, reference = _tiled(k, n, group)
    x, residual, weight = _norm_inputs(tokens, k, dtype)
    tile = RowsTile(block_k=256, num_warps=2)
    bias = torch.randn(n, generator=torch.Generator().manual_seed(2)).to(DEVICE, dtype)
    out, new_residual = awq_rows_add_rms_norm(
        x, residual, weight, 1e-6, qweight, zeros, scales, group, chunk, bias, tile=tile
    )
    normed, summed = fused_ops.add_rms_norm(x, residual, weight, 1e-6)
    assert torch.equal(new_residual, summed)
    assert _rel_err(out, _want(normed, reference, bias)) <= TOLERANCE[dtype]
    unfused = awq_rows(normed, qweight, zeros, scales, group, chunk, bias)
    assert _rel_err(out, unfused) <= TOLERANCE[dtype] / 4


def check_gated(tokens: int, dtype: torch.dtype, tile: RowsTile | WideTile) -> None:
    """A merged ``[gate | up]`` (36 + 36 columns, a tile of 8 cut short) launched gated with
    ``tile``: ``silu(gate) * up`` of the unfused launches (add+norm, the merged product by
    the row GEMV, the SiLU kernel); a program that read the wrong up columns or their
    scales fails."""
    qweight, zeros, scales, chunk, reference = _tiled(384, 72, 64, seed=7)
    x, residual, weight = _norm_inputs(tokens, 384, dtype)
    bias = torch.randn(72, generator=torch.Generator().manual_seed(8)).to(DEVICE, dtype)
    out, new_residual = awq_rows_add_rms_norm(
        x, residual, weight, 1e-6, qweight, zeros, scales, 64, chunk, bias, gated=True,
        tile=tile,
    )  # fmt: skip
    normed, summed = fused_ops.add_rms_norm(x, residual, weight, 1e-6)
    assert torch.equal(new_residual, summed) and out.shape == (tokens, 36)
    gate_up = awq_rows(normed, qweight, zeros, scales, 64, chunk, bias, RowsTile())
    want = fused_ops.silu_and_mul(gate_up[:, :36], gate_up[:, 36:])
    assert _rel_err(out, want) <= TOLERANCE[dtype] / 4
    swapped = fused_ops.silu_and_mul(gate_up[:, 36:], gate_up[:, :36])
    assert _rel_err(out, swapped) > 10 * TOLERANCE[dtype]


@pytest.mark.parametrize("tokens", [1, 2])
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=str)
def test_gated_equals_norm_rows_then_silu(tokens: int, dtype: torch.dtype) -> None:
    check_gated(tokens, dtype, RowsTile(block_n=8))


def test_reads_strided_views() -> None:
    """A layer viewing its columns of merged scales / zero points reads the right ones."""
    qweight, zeros, scales, chunk, reference = _tiled(384, 96, 128)
    cols = slice(32, 96)
    assert not scales[:, cols].is_contiguous()
    x = _x(1, 384, torch.float16)
    out = awq_rows(x, qweight[cols], zeros[:, cols], scales[:, cols], 128, chunk)
    assert _rel_err(out, _want(x, reference[:, cols], None)) <= TOLERANCE[torch.float16]


def test_refuses_what_it_cannot_run() -> None:
    assert awq_method.ROW_GEMV_MAX_TOKENS <= ROWS_MAX_TOKENS  # the method never asks for more
    qweight, zeros, scales, chunk, _ = _tiled(192, 40, 64)
    x = _x(ROWS_MAX_TOKENS + 1, 192, torch.float16)
    with pytest.raises(AssertionError, match="1 to 4 rows"):
        awq_rows(x, qweight, zeros, scales, 64, chunk)


def _spy(monkeypatch: pytest.MonkeyPatch, name: str) -> list[dict]:
    calls: list[dict] = []
    real = getattr(rows, name)

    def spy(*args, **kwargs):  # type: ignore[no-untyped-def]
        calls.append({"rows": args[0].shape[0], **kwargs})
        return real(*args, **kwargs)

    monkeypatch.setattr(rows, name, spy)
    return calls


def _tiled_layer() -> torch.nn.Module:
    """One AWQ layer (K 128, N 72, group 64) on the tiled layout."""
    from test_awq_merge import _layers

    layer = _layers(group_size=64, sizes_and_gains=((72, 1.0),))[0]
    if layer.awq_chunk is None:
        assert layer.quant_method.repack(layer)
    return layer


def test_method_sends_one_token_to_the_row_gemv(monkeypatch: pytest.MonkeyPatch) -> None:
    """``apply`` / ``apply_add_rms_norm`` / ``apply_add_rms_norm_silu`` of a tiled layer:
    the row launches at one token; two tokens (and ``ROW_GEMV_MAX_TOKENS`` 0, what
    ``ENGINE_AWQ_ROW_GEMV=0`` sets) keep the split-K GEMV and refuse the gated call."""
    layer = _tiled_layer()
    method = layer.quant_method
    plain, fused = _spy(monkeypatch, "awq_rows"), _spy(monkeypatch, "awq_rows_add_rms_norm")
    reference = method.dequantize_weight(layer, torch.float32).t()
    x, residual, weight = _norm_inputs(1, 128, torch.float16)
    out = method.apply(layer, x)
    assert _rel_err(out, _want(x, reference, None)) <= TOLERANCE[torch.float16]
    normed, _ = method.apply_add_rms_norm(layer, x, residual, weight, 1e-6)
    gated, _ = method.apply_add_rms_norm_silu(layer, x, residual, weight, 1e-6)
    assert gated.shape == (1, 36)
    assert [c["rows"] for c in plain] == [1] and [c.get("gated") for c in fused] == [None, True]
    x2, residual2, _ = _norm_inputs(2, 128, torch.float16)
    assert awq_method.select_path(layer, 2, torch.float16) == "gemv"
    assert method.apply_add_rms_norm_silu(layer, x2, residual2, weight, 1e-6) is None
    monkeypatch.setattr(awq_method, "ROW_GEMV_MAX_TOKENS", 0)
    assert awq_method.select_path(layer, 1, torch.float16) == "gemv"
    assert method.apply_add_rms_norm_silu(layer, x, residual, weight, 1e-6) is None
    split_k, _ = method.apply_add_rms_norm(layer, x, residual, weight, 1e-6)
    assert len(plain) == 1 and len(fused) == 2  # no row launch since the switch
    assert _rel_err(split_k, normed) <= TOLERANCE[torch.float16]


def test_method_leaves_the_norm_of_long_rows_to_the_decoder(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """One-token rows longer than ``ROWS_FUSE_NORM_MAX_K`` (``ENGINE_AWQ_FUSE_NORM_MAX_K``):
    ``apply_add_rms_norm`` and ``apply_add_rms_norm_silu`` return None (the decoder runs
    its add+RMSNorm and SiLU kernels) and ``apply`` still takes the row GEMV; rows of
    exactly the limit take the fused launches."""
    layer = _tiled_layer()
    method = layer.quant_method
    plain, fused = _spy(monkeypatch, "awq_rows"), _spy(monkeypatch, "awq_rows_add_rms_norm")
    x, residual, weight = _norm_inputs(1, 128, torch.float16)
    monkeypatch.setattr(awq_method, "ROWS_FUSE_NORM_MAX_K", 127)
    assert method.apply_add_rms_norm(layer, x, residual, weight, 1e-6) is None
    assert method.apply_add_rms_norm_silu(layer, x, residual, weight, 1e-6) is None
    reference = method.dequantize_weight(layer, torch.float32).t()
    assert _rel_err(method.apply(layer, x), _want(x, reference, None)) <= TOLERANCE[torch.float16]
    assert len(plain) == 1 and fused == []
    monkeypatch.setattr(awq_method, "ROWS_FUSE_NORM_MAX_K", 128)
    assert method.apply_add_rms_norm(layer, x, residual, weight, 1e-6) is not None
    assert len(fused) == 1


@pytest.mark.skipif(DEVICE == "cuda", reason="builds the model on the CPU")
@pytest.mark.parametrize("long_rows", [False, True], ids=["fused", "rows-past-the-limit"])
def test_tiny_qwen3_decode_row_takes_the_fused_launches(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, long_rows: bool
) -> None:
    """One token through a tiny AWQ Qwen3 on the tiled layout (merged projections): every
    gate/up takes the gated launch, q/k/v after the first layer the add+RMSNorm one, o and
    down (and the first q/k/v) the plain one; with its rows longer than
    ``ROWS_FUSE_NORM_MAX_K`` every projection takes the plain launch after the decoder's
    own add+RMSNorm (and SiLU-and-mul). Tokens and logits equal the checkpoint layout's
    (torch dequantize path) either way."""
    from engine_sdk.layers import decoder
    from engine_sdk.testing.quantized_model import greedy
    from test_awq_merge import reference_and_tiled_models

    reference, tiled = reference_and_tiled_models(tmp_path, seed=6)
    for switch in ("ENGINE_FUSED_NORM", "ENGINE_FUSED_SILU"):  # on, whatever ran before
        monkeypatch.delenv(switch, raising=False)
    decoder._fused_norm_enabled.cache_clear()
    decoder._fused_silu_enabled.cache_clear()
    hidden = tiled.model.layers[0].input_layernorm.weight.numel()
    monkeypatch.setattr(awq_method, "ROWS_FUSE_NORM_MAX_K", hidden - 1 if long_rows else hidden)
    plain, fused = _spy(monkeypatch, "awq_rows"), _spy(monkeypatch, "awq_rows_add_rms_norm")
    tokens, logits = greedy(tiled, [42], 1)
    layers = len(tiled.model.layers)
    if long_rows:
        assert fused == [] and len(plain) == 4 * layers  # q/k/v, o, gate/up, down
    else:
        assert [c.get("gated", False) for c in fused].count(True) == layers
        assert len(fused) == 2 * layers - 1  # the first layer's norm has no residual yet
        assert len(plain) == 2 * layers + 1  # o, down; the first q/k/v
    want_tokens, want_logits = greedy(reference, [42], 1)
    assert tokens == want_tokens
    torch.testing.assert_close(logits.float(), want_logits.float(), rtol=2e-2, atol=2e-2)


def test_tile_comes_from_the_measured_table(monkeypatch: pytest.MonkeyPatch) -> None:
    """``rows_tile`` asks the table for the launch's kernel name at the weight's shape and
    builds the tile from the row's fields; no row gives the default; the sweep switches
    (``ENGINE_AWQ_ROWS_BLOCK_N`` / ``_BLOCK_K``) win over a row."""
    asked: list[tuple] = []
    table = {
        ("awq_rows_gated_c128", 28672, 4096, 1): {
            "block_n": 8,
            "block_k": 1024,
            "num_warps": 2,
            "num_stages": 1,
            "ms": 0.02,
        }
    }

    def lookup(package: str, kernel: str, device, n: int, k: int, tokens: int):  # type: ignore[no-untyped-def]
        asked.append((package, kernel, n, k, tokens))
        return table.get((kernel, n, k, tokens))

    monkeypatch.setattr(rows, "tuned_config", lookup)
    monkeypatch.setattr(rows, "SWEEP_TILE", False)
    cpu = torch.device("cpu")
    assert rows.rows_tile(cpu, "gated", 1, 28672, 4096, 128) == RowsTile(8, 1024, 2, 1)
    assert asked[-1] == ("engine_awq", "awq_rows_gated_c128", 28672, 4096, 1)
    assert rows.rows_tile(cpu, "plain", 1, 28672, 4096, 128) == RowsTile()
    assert asked[-1][1] == "awq_rows_plain_c128"
    monkeypatch.setattr(rows, "SWEEP_TILE", True)  # ENGINE_AWQ_ROWS_BLOCK_N/_K at import
    assert rows.rows_tile(cpu, "gated", 1, 28672, 4096, 128) == RowsTile()


def test_launch_uses_the_tile_of_its_launch(monkeypatch: pytest.MonkeyPatch) -> None:
    """Without a tile argument each launch looks up its own kind (plain, norm, gated) with
    the whole weight's rows, and the tile it gets is the one that runs: a table tile of 8
    columns still gives the reference."""
    asked: list[tuple] = []

    def lookup(device, launch: str, tokens: int, n: int, k: int, chunk: int) -> RowsTile:  # type: ignore[no-untyped-def]
        asked.append((launch, tokens, n, k, chunk))
        return RowsTile(8, 128, 2, 1)

    monkeypatch.setattr(rows, "rows_tile", lookup)
    qweight, zeros, scales, chunk, reference = _tiled(384, 72, 64, seed=9)
    x, residual, weight = _norm_inputs(2, 384, torch.float16)
    out = awq_rows(x, qweight, zeros, scales, 64, chunk)
    assert _rel_err(out, _want(x, reference, None)) <= TOLERANCE[torch.float16]
    awq_rows_add_rms_norm(x, residual, weight, 1e-6, qweight, zeros, scales, 64, chunk)
    awq_rows_add_rms_norm(
        x, residual, weight, 1e-6, qweight, zeros, scales, 64, chunk, gated=True
    )  # fmt: skip
    assert asked == [(launch, 2, 72, 384, chunk) for launch in ("plain", "norm", "gated")]


def test_loop_stages_come_from_the_tile_else_the_switch(monkeypatch: pytest.MonkeyPatch) -> None:
    """The K loop's pipeline stages (the kernel's ``STAGES``): a tile's ``loop_stages`` (a
    table row's, written by the sweep) wins; a tile without takes ``LOOP_STAGES``
    (``ENGINE_AWQ_LOOP_STAGES``, 0 by default: the plain loop)."""
    launched: list[dict] = []

    class Kernel:
        def __getitem__(self, grid: tuple[int, ...]):  # type: ignore[no-untyped-def]
            return lambda *args, **kw: launched.append(kw)

    monkeypatch.setattr(rows, "awq_rows_kernel", Kernel())
    qweight, zeros, scales, chunk, _ = _tiled(384, 72, 64, seed=9)
    x = torch.randn(1, 384, dtype=torch.float16)
    if "ENGINE_AWQ_LOOP_STAGES" not in os.environ:  # (the GPU script sets it to time it)
        assert rows.LOOP_STAGES == 0
    monkeypatch.setattr(rows, "LOOP_STAGES", 0)
    awq_rows(x, qweight, zeros, scales, 64, chunk, tile=RowsTile(4, 128))
    monkeypatch.setattr(rows, "LOOP_STAGES", 3)
    awq_rows(x, qweight, zeros, scales, 64, chunk, tile=RowsTile(4, 128))
    awq_rows(x, qweight, zeros, scales, 64, chunk, tile=RowsTile(4, 128, loop_stages=2))
    assert [kw["STAGES"] for kw in launched] == [0, 3, 2]
    row = {"block_n": 8, "block_k": 1024, "num_warps": 4, "loop_stages": 2, "ms": 0.02}
    monkeypatch.setattr(rows, "tuned_config", lambda *a: row)
    monkeypatch.setattr(rows, "SWEEP_TILE", False)
    tile = rows.rows_tile(torch.device("cpu"), "gated", 1, 28672, 4096, 128)
    assert tile == RowsTile(8, 1024, 4, None, 2)


@pytest.mark.parametrize("tile", [RowsTile(block_n=8), WideTile(8, 256)], ids=["rows", "wide"])
def test_launches_name_every_constexpr(tile: RowsTile | WideTile) -> None:
    """The one-token launches, plain and gated with the norm, name every constexpr,
    defaults included, as torch.compile's launchers need (``engine_sdk.testing.launches``;
    Triton's interpreter, so CPU only)."""
    if DEVICE == "cuda":
        pytest.skip("records the interpreter's launches")
    from engine_sdk.testing.launches import recorded_launches

    qweight, zeros, scales, chunk, _ = _tiled(384, 72, 64, seed=7)
    x = _x(1, 384, torch.bfloat16, seed=1)
    with recorded_launches() as seen:
        awq_rows(x, qweight, zeros, scales, 64, chunk, None, tile)
        check_gated(1, torch.bfloat16, tile)
    kernel = "awq_wide_kernel" if isinstance(tile, WideTile) else "awq_rows_kernel"
    assert kernel in seen.kernels, seen.kernels
    assert seen.unpassed == set(), seen.unpassed
