"""The tiled AWQ layout and its W4A16 kernels (Triton's interpreter on a CPU, the real
kernels on a GPU): the repack round-trips, the kernels equal the dequantized reference, and
the layer picks the CUDA-core, tensor-core or dequantize path by the number of tokens."""

from __future__ import annotations

import pytest
import torch
from awq_formats import awq_gemm
from engine_awq import gemv, method, rows, w4a16
from engine_awq.config import AwqConfig
from engine_awq.method import DOT_MAX_TOKENS, FMA_MAX_TOKENS, select_path
from engine_awq.packing import awq_dequantize, pack_awq
from engine_awq.tiled import dequantize_tiled, pick_chunk, repack_tiled, unpack_tiled
from engine_awq.w4a16 import GemmConfig, awq_w4a16_dequantize, awq_w4a16_gemm
from engine_sdk.layers.linear import Linear

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
GEMV_MAX_TOKENS = 16  # the split-K GEMV's limit (the default; ENGINE_QUANT_GEMV=0: 0)
CONFIG = {"quant_method": "awq", "bits": 4, "zero_point": True, "version": "gemm"}


def _packed(num_in: int, num_out: int, group_size: int, seed: int = 0) -> dict:
    weight = torch.randn(num_out, num_in, generator=torch.Generator().manual_seed(seed)) * 0.05
    return {k: v.to(DEVICE) for k, v in awq_gemm(weight, group_size).tensors.items()}


def _tiled(num_in: int, num_out: int, group_size: int, seed: int = 0) -> tuple:
    t = _packed(num_in, num_out, group_size, seed)
    chunk = pick_chunk(num_in, group_size)
    assert chunk is not None
    qweight, zeros = repack_tiled(t["qweight"], t["qzeros"], chunk)
    reference = awq_dequantize(t["qweight"], t["qzeros"], t["scales"], group_size, torch.float32)
    return qweight, zeros, t["scales"], chunk, reference


def _x(num_tokens: int, num_in: int, dtype: torch.dtype, seed: int = 1) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    return torch.randn(num_tokens, num_in, generator=gen).to(DEVICE, dtype)


def _rel_err(got: torch.Tensor, want: torch.Tensor) -> float:
    got, want = got.double().cpu(), want.double().cpu()
    return float((got - want).abs().max() / want.abs().max())


# -- layout -------------------------------------------------------------------------------


def test_pick_chunk() -> None:
    assert pick_chunk(4096, 128) == 128
    assert pick_chunk(4096, 32) == 128  # 16-row nibble slices inside 32-row groups
    assert pick_chunk(4096, 8) == 64  # 8-row slices
    assert pick_chunk(96, 32) == 32
    assert pick_chunk(4096, 12) == 32
    assert pick_chunk(4096, 6) is None and pick_chunk(100, 32) is None


def test_known_word() -> None:
    """Chunk 32 (4 words per row): nibble i of word j holds k = 4i + j."""
    codes = (torch.arange(32, dtype=torch.int32) % 16)[:, None].repeat(1, 8)  # q[k, n] = k % 16
    tiled, _ = repack_tiled(pack_awq(codes), pack_awq(torch.zeros(1, 8, dtype=torch.int32)), 32)
    assert tiled.shape == (8, 4)
    for j in range(4):
        word = int(tiled[0, j]) & 0xFFFFFFFF
        assert [(word >> (4 * i)) & 0xF for i in range(8)] == [(4 * i + j) % 16 for i in range(8)]


@pytest.mark.parametrize("chunk", [128, 64, 32])
def test_repack_round_trips(chunk: int) -> None:
    gen = torch.Generator().manual_seed(chunk)
    codes = torch.randint(0, 16, (256, 48), generator=gen, dtype=torch.int32)
    codes[0, :] = 15  # top nibbles set: negative int32 words
    zeros = torch.randint(0, 16, (256 // 32, 48), generator=gen, dtype=torch.int32)
    tiled, tiled_zeros = repack_tiled(pack_awq(codes), pack_awq(zeros), chunk)
    assert tiled.dtype == torch.int32 and tiled.shape == (48, 256 // 8)
    assert torch.equal(unpack_tiled(tiled, chunk), codes)
    assert tiled_zeros.dtype == torch.uint8 and torch.equal(tiled_zeros.int(), zeros)


@pytest.mark.parametrize("group_size", [128, 32])
def test_tiled_dequantize_equals_the_checkpoint_layout(group_size: int) -> None:
    qweight, zeros, scales, chunk, reference = _tiled(256, 40, group_size)
    got = dequantize_tiled(qweight, zeros, scales, group_size, chunk, torch.float32)
    assert torch.equal(got, reference)
    dense = awq_w4a16_dequantize(qweight, zeros, scales, group_size, chunk, torch.float32)
    assert torch.equal(dense, reference.t())  # the Triton pass, [N, K]


# -- the GEMM -----------------------------------------------------------------------------

# (tokens, K, N, group, config); group 32 < chunk 128 exercises per-slice zeros/scales,
# K 96 a 32-row chunk, the configs the split-K reduction and partial tiles.
GEMM_CASES = [
    (1, 256, 64, 128, GemmConfig("fma", 1, 64)),
    (1, 256, 72, 128, GemmConfig("fma", 1, 32, split=2)),
    (3, 256, 64, 32, GemmConfig("fma", 4, 32)),
    (2, 96, 48, 32, GemmConfig("fma", 2, 16, split=3)),
    (8, 256, 64, 128, GemmConfig("dot", 16, 32)),
    (16, 384, 80, 64, GemmConfig("dot", 16, 32, split=3)),
    (19, 256, 64, 32, GemmConfig("dot", 16, 64, split=2)),
]


# Output rounding relative to the largest output: fp16 2^-11, bf16 2^-8, with margin.
TOLERANCE = {torch.float16: 2e-3, torch.bfloat16: 1e-2}


@pytest.mark.parametrize(("num_tokens", "num_in", "num_out", "group_size", "config"), GEMM_CASES)
@pytest.mark.parametrize("bias", [False, True])
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=str)
def test_gemm_equals_dequantized_reference(
    num_tokens: int,
    num_in: int,
    num_out: int,
    group_size: int,
    config: GemmConfig,
    bias: bool,
    dtype: torch.dtype,
) -> None:
    qweight, zeros, scales, chunk, reference = _tiled(num_in, num_out, group_size)
    x = _x(num_tokens, num_in, dtype)
    b = (
        torch.randn(num_out, generator=torch.Generator().manual_seed(2)).to(DEVICE)
        if bias
        else None
    )
    out = awq_w4a16_gemm(x, qweight, zeros, scales, group_size, chunk, b, config)
    want = x.double().cpu() @ reference.double().cpu()
    if b is not None:
        want = want + b.double().cpu()
    assert out.shape == (num_tokens, num_out) and out.dtype == dtype
    assert _rel_err(out, want) <= TOLERANCE[dtype]


def test_gemm_float32_is_exact_to_rounding() -> None:
    """In float32 (interpreter) the fused zero/scale algebra adds only summation error."""
    if DEVICE != "cpu":
        pytest.skip("float32 dots are TF32 on a GPU")
    qweight, zeros, scales, chunk, reference = _tiled(512, 64, 128, seed=4)
    x = _x(3, 512, torch.float32)
    want = x.double() @ reference.double()
    for config in (GemmConfig("fma", 4, 64), GemmConfig("dot", 16, 64, split=2)):
        out = awq_w4a16_gemm(x, qweight, zeros, scales, 128, chunk, None, config)
        assert _rel_err(out, want) <= 1e-6


def test_gemm_reads_strided_views() -> None:
    """A layer viewing its columns of merged scales/zeros (strided rows) reads the right ones."""
    qweight, zeros, scales, chunk, reference = _tiled(256, 96, 128)
    sl = slice(32, 96)
    x = _x(2, 256, torch.float16)
    out = awq_w4a16_gemm(x, qweight[sl], zeros[:, sl], scales[:, sl], 128, chunk)
    assert not scales[:, sl].is_contiguous()
    assert _rel_err(out, x.double().cpu() @ reference[:, sl].double().cpu()) <= 2e-3


# -- the layer's choice ----------------------------------------------------------------------


def _layer(bias: bool = True) -> Linear:
    cfg = AwqConfig.from_config({**CONFIG, "group_size": 32})
    with torch.device(DEVICE):
        layer = Linear(128, 64, bias, cfg, "model.layers.0.mlp.up_proj", torch.float16)
    for name, tensor in _packed(128, 64, 32, seed=5).items():
        getattr(layer, name).data.copy_(tensor)
    if bias:
        layer.bias.data.normal_()
    layer.quant_method.process_weights_after_loading(layer)
    return layer


def test_load_repacks_on_cuda_only() -> None:
    layer = _layer()
    assert (layer.awq_chunk is not None) is (DEVICE == "cuda")
    if layer.awq_chunk is None:  # CPU: the checkpoint layout and the torch reference
        assert hasattr(layer, "qweight") and not hasattr(layer, "tiled_qweight")
        assert select_path(layer, 1, torch.float16) == "reference"
        assert layer.quant_method.repack(layer)
    assert not hasattr(layer, "qweight") and not hasattr(layer, "qzeros")
    assert layer.tiled_qweight.shape == (64, 16) and layer.tiled_zeros.shape == (4, 64)


def test_layer_picks_the_path_by_tokens(monkeypatch: pytest.MonkeyPatch) -> None:
    layer = _layer()
    reference = layer.quant_method.dequantize_weight(layer, torch.float32)  # checkpoint layout
    if layer.awq_chunk is None:
        layer.quant_method.repack(layer)
    torch.testing.assert_close(
        layer.quant_method.dequantize_weight(layer, torch.float32), reference
    )
    ran: list[str] = []
    real_gemm, real_dequant, real_gemv = (
        w4a16.awq_w4a16_gemm, w4a16.awq_w4a16_dequantize, gemv.awq_gemv
    )  # fmt: skip

    def gemm(*args, **kwargs):  # type: ignore[no-untyped-def]
        ran.append(args[7].variant)
        return real_gemm(*args, **kwargs)

    def dequant(*args, **kwargs):  # type: ignore[no-untyped-def]
        ran.append("dequant")
        return real_dequant(*args, **kwargs)

    def gemv_spy(*args, **kwargs):  # type: ignore[no-untyped-def]
        ran.append("gemv")
        assert args[8] is layer.gemv_locks  # the layer's counters, no memset per call
        return real_gemv(*args, **kwargs)

    monkeypatch.setattr(w4a16, "awq_w4a16_gemm", gemm)
    monkeypatch.setattr(w4a16, "awq_w4a16_dequantize", dequant)

    def rows_spy(*args, **kwargs):  # type: ignore[no-untyped-def]
        ran.append("rows")
        return real_rows(*args, **kwargs)

    real_rows = rows.awq_rows
    monkeypatch.setattr(gemv, "awq_gemv", gemv_spy)
    monkeypatch.setattr(rows, "awq_rows", rows_spy)
    monkeypatch.setattr(method, "GEMV_MAX_TOKENS", GEMV_MAX_TOKENS)  # as by default
    monkeypatch.setattr(method, "ROW_GEMV_MAX_TOKENS", 1)
    cases = [(1, "rows"), (2, "gemv"), (GEMV_MAX_TOKENS, "gemv"), (GEMV_MAX_TOKENS + 1, "dot")]
    cases += [(DOT_MAX_TOKENS + 1, "dequant")]
    for num_tokens, path in cases:
        ran.clear()
        x = _x(num_tokens, 128, torch.float16, seed=num_tokens)
        with torch.inference_mode():
            out = layer(x)
        assert ran == [path], (num_tokens, ran)
        want = x.double().cpu() @ reference.double().cpu().t() + layer.bias.double().cpu()
        assert _rel_err(out, want) <= 2e-3
    assert not layer.gemv_locks.any()  # back to zero after every call
    # The old CUDA-core GEMM is reached only when the GEMV's range is lowered below it.
    monkeypatch.setattr(method, "GEMV_MAX_TOKENS", 1)
    assert select_path(layer, 2, torch.float16) == "fma"
    assert select_path(layer, FMA_MAX_TOKENS + 1, torch.float16) == "dot"
    ran.clear()
    layer(_x(2, 128, torch.float32))  # float32 activations: the dense path
    assert ran == ["dequant"]
