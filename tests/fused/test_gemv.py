"""The small-batch GEMV against a float32 matmul, and the Linear layer's use of it
(Triton's interpreter on CPU, the compiled kernel on a GPU)."""

from __future__ import annotations

import pytest
import torch
from engine_sdk.layers import gemv
from engine_sdk.layers.linear import Linear

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
DTYPES = [torch.bfloat16, torch.float16]


@pytest.fixture(autouse=True)
def _force_gemv(monkeypatch):
    if DEVICE == "cpu":
        monkeypatch.setenv("ENGINE_GEMV", "force")


def _ulp_tol(ref: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """The output's own rounding (half an ulp of the dtype) plus float32 summation slack."""
    eps = torch.finfo(dtype).eps
    return ref.abs() * eps + 1e-3


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize(
    "rows,n,k,bias,tiles",
    [
        (1, 33, 70, False, None),  # N and K not multiples of anything
        (3, 64, 1030, True, (4, 256, 4)),  # K over several chunks, a partial last chunk
        (4, 17, 2048, False, (1, 16, 4)),  # one weight row per program, many chunks
        (2, 5, 16, True, None),
        (4, 40, 300, True, (16, 128, 4)),  # row block wider than a tail of N
    ],
)
def test_gemv_matches_float32_matmul(rows, n, k, bias, tiles, dtype):
    gen = torch.Generator().manual_seed(rows * 1000 + n + k)
    x = torch.randn(rows, k, generator=gen).to(dtype).to(DEVICE)
    w = torch.randn(n, k, generator=gen).to(dtype).to(DEVICE)
    b = torch.randn(n, generator=gen).to(dtype).to(DEVICE) if bias else None
    ref = x.float() @ w.float().T + (b.float() if b is not None else 0)
    got = gemv.gemv(x, w, b, tiles)
    assert got.shape == (rows, n) and got.dtype == dtype
    err = (got.float() - ref).abs()
    assert bool((err <= _ulp_tol(ref, dtype)).all()), err.max()


def test_gemv_reads_every_row_of_x_with_its_own_weights():
    """Rows differ and the result must differ row by row (a kernel reusing row 0 fails)."""
    x = torch.eye(4, 64, dtype=torch.bfloat16, device=DEVICE)
    w = torch.arange(10 * 64, dtype=torch.float32).reshape(10, 64).to(torch.bfloat16).to(DEVICE)
    got = gemv.gemv(x, w).float().cpu()
    assert torch.equal(got, w.float().cpu()[:, :4].T)


def test_linear_uses_gemv_for_few_rows_and_the_library_gemm_otherwise(monkeypatch):
    layer = Linear(96, 48, bias=True, params_dtype=torch.bfloat16).to(DEVICE)
    gen = torch.Generator().manual_seed(3)
    layer.weight.data = torch.randn(48, 96, generator=gen).to(torch.bfloat16).to(DEVICE)
    layer.bias.data = torch.randn(48, generator=gen).to(torch.bfloat16).to(DEVICE)
    calls = []
    original = gemv.gemv

    def recording(*args, **kwargs):
        calls.append(args[0].shape[0])
        return original(*args, **kwargs)

    monkeypatch.setattr(gemv, "gemv", recording)
    for rows in (1, gemv.MAX_ROWS, gemv.MAX_ROWS + 1):
        x = torch.randn(rows, 96, generator=gen).to(torch.bfloat16).to(DEVICE)
        ref = x.float() @ layer.weight.float().T + layer.bias.float()
        torch.testing.assert_close(layer(x).float(), ref, atol=0.1, rtol=0.02)
    assert calls == [1, gemv.MAX_ROWS]


def test_use_gemv_declines_what_it_cannot_run(monkeypatch):
    w = torch.randn(8, 32, dtype=torch.bfloat16, device=DEVICE)
    x = torch.randn(2, 32, dtype=torch.bfloat16, device=DEVICE)
    assert gemv.use_gemv(x, w)
    assert not gemv.use_gemv(x.float(), w.float())  # float32: the library GEMM
    assert not gemv.use_gemv(x, w.T.contiguous().T)  # a transposed weight view
    assert not gemv.use_gemv(torch.randn(gemv.MAX_ROWS + 1, 32, dtype=torch.bfloat16), w)
    wide = torch.randn(64, 32, dtype=torch.bfloat16, device=DEVICE)  # N >= K: cuBLAS at 2 rows
    assert gemv.use_gemv(x[:1], wide) and not gemv.use_gemv(x, wide)
    assert not gemv.use_gemv(x[:, None, :], w)
    monkeypatch.setenv("ENGINE_GEMV", "0")
    assert not gemv.use_gemv(x, w)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize(
    "rows,n,k,bias", [(1, 33, 70, False), (3, 24, 1030, True), (4, 9, 256, False)]
)
def test_gemv_add_rms_norm_equals_norm_then_gemv(rows, n, k, bias, dtype):
    """One launch gives the projection of rms_norm(x + residual) and the new residual:
    the residual bit for bit, the output as add_rms_norm followed by the GEMV."""
    from engine_sdk.layers import fused_ops

    gen = torch.Generator().manual_seed(rows * 11 + n + k)
    x = (torch.randn(rows, k, generator=gen) * 2).to(dtype).to(DEVICE)
    residual = torch.randn(rows, k, generator=gen).to(dtype).to(DEVICE)
    norm_w = (1 + 0.1 * torch.randn(k, generator=gen)).to(dtype).to(DEVICE)
    w = torch.randn(n, k, generator=gen).to(dtype).to(DEVICE)
    b = torch.randn(n, generator=gen).to(dtype).to(DEVICE) if bias else None
    normed, want_res = fused_ops.add_rms_norm(x, residual, norm_w, 1e-6)
    want = gemv.gemv(normed, w, b, (2, max(16, 1 << (k - 1).bit_length()), 4))
    got, got_res = gemv.gemv_add_rms_norm(x, residual, norm_w, 1e-6, w, b)
    assert got.shape == (rows, n) and got.dtype == dtype and got_res.shape == (rows, k)
    assert torch.equal(got_res, want_res)
    # the variance's float32 sum may be ordered differently: an ulp of a normalized value
    tol = 4 * torch.finfo(dtype).eps * (normed.float().abs() @ w.float().abs().T)
    assert bool(((got.float() - want.float()).abs() <= tol + 1e-3).all())


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize(
    "rows,inter,k,bias", [(1, 33, 70, False), (3, 24, 1030, True), (4, 9, 256, True)]
)
def test_gated_gemv_add_rms_norm_equals_the_merged_projection_then_silu(
    rows, inter, k, bias, dtype
):
    """The gated launch gives silu(gate) * up of the merged [gate | up] projection of
    rms_norm(x + residual): as the plain launch then silu_and_mul_merged (the same
    roundings: gate and up to the dtype, the product once), and the same new residual."""
    from engine_sdk.layers import fused_ops

    gen = torch.Generator().manual_seed(rows * 7 + inter + k)
    x = (torch.randn(rows, k, generator=gen) * 2).to(dtype).to(DEVICE)
    residual = torch.randn(rows, k, generator=gen).to(dtype).to(DEVICE)
    norm_w = (1 + 0.1 * torch.randn(k, generator=gen)).to(dtype).to(DEVICE)
    w = (torch.randn(2 * inter, k, generator=gen) / k**0.5).to(dtype).to(DEVICE)
    b = torch.randn(2 * inter, generator=gen).to(dtype).to(DEVICE) if bias else None
    gate_up, want_res = gemv.gemv_add_rms_norm(x, residual, norm_w, 1e-6, w, b)
    want = fused_ops.silu_and_mul_merged(gate_up) if DEVICE == "cuda" else None
    if want is None:  # the reference formula of silu_mul_merged_kernel, in float32
        g, u = gate_up.float().chunk(2, dim=-1)
        want = (g / (1.0 + torch.exp(-g)) * u).to(dtype)
    got, got_res = gemv.gemv_add_rms_norm(x, residual, norm_w, 1e-6, w, b, gated=True)
    assert got.shape == (rows, inter) and got.dtype == dtype
    assert torch.equal(got_res, want_res)
    # the same float32 sums in the same order: equal but for exp's last bit
    torch.testing.assert_close(got, want, atol=1e-3, rtol=2 * torch.finfo(dtype).eps)
    # and not the ungated output's first half (the up rows were used)
    assert not torch.allclose(got.float(), gate_up[:, :inter].float(), atol=1e-2)


def test_gated_gemv_refuses_a_lora_epilogue():
    x = torch.zeros(1, 16)
    with pytest.raises(AssertionError, match="no LoRA epilogue"):
        gemv.gemv_add_rms_norm(x, x, x[0], 1e-6, torch.zeros(8, 16), lora=object(), gated=True)  # type: ignore[arg-type]


@pytest.mark.skipif(DEVICE == "cuda", reason="the SDK's dense test attention runs on the CPU")
def test_decoder_takes_the_norm_gemv_at_decode(monkeypatch, tmp_path):
    """One token (a decode-shaped row) through a tiny Qwen3 built from the SDK's generic
    decoder runs gemv_add_rms_norm for q/k/v (every layer but the first, whose norm has
    no residual yet) and gate/up; the logits equal the unfused path's (ENGINE_GEMV=0).
    On a GPU the kernel's own tests and the engine's decode checks cover it."""
    from engine_sdk.layers import decoder
    from tiny_decoder import tiny_bf16_qwen3

    model, logits = tiny_bf16_qwen3(tmp_path, DEVICE)
    calls = {"norm": 0, "gated": 0}
    norm_fn = gemv.gemv_add_rms_norm

    def norm(*args, **kwargs):
        calls["gated" if kwargs.get("gated") else "norm"] += 1
        return norm_fn(*args, **kwargs)

    monkeypatch.setattr(gemv, "gemv_add_rms_norm", norm)
    num_layers = len(model.model.layers)

    fused = logits()  # gate/up with the activation in its launch
    assert calls == {"norm": num_layers - 1, "gated": num_layers}
    monkeypatch.setenv("ENGINE_FUSED_SILU", "0")
    decoder._fused_silu_enabled.cache_clear()
    try:
        fused_no_silu = logits()  # the plain norm GEMV for gate/up, SiLU on its own
    finally:  # the switch back on before the cache is cleared: a later read caches True
        monkeypatch.delenv("ENGINE_FUSED_SILU")
        decoder._fused_silu_enabled.cache_clear()
    assert calls == {"norm": 3 * num_layers - 2, "gated": num_layers}
    monkeypatch.setenv("ENGINE_GEMV", "0")
    unfused = logits()
    assert calls == {"norm": 3 * num_layers - 2, "gated": num_layers}
    # on the CPU the separate SiLU is torch's, rounded after silu and after the product
    torch.testing.assert_close(fused, fused_no_silu, atol=0.05, rtol=0.05)
    torch.testing.assert_close(fused, unfused, atol=0.05, rtol=0.05)


def test_is_plain_linear_follows_the_lora_context():
    """A LoRA layer is plain (fused decode kernels may take its weight) only in steps
    without adapter tokens; quantized or subclassed layers never are."""
    from engine_sdk.layers.linear import is_plain_linear
    from engine_sdk.layers.lora import LoRAContext, LoRALayer

    layer = Linear(32, 16, params_dtype=torch.bfloat16)
    assert is_plain_linear(layer)
    context = LoRAContext(8, "cpu")
    layer.lora = LoRALayer(context, 2, 4, 32, [16], torch.bfloat16, "cpu")
    assert is_plain_linear(layer)  # LoRA on, no adapter token in this step
    context.active = True
    assert not is_plain_linear(layer)

    class Custom(Linear):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return super().forward(x) * 2

    assert not is_plain_linear(Custom(32, 16)) and not is_plain_linear(None)


@pytest.mark.parametrize("rows", [1, 3])
def test_lm_head_takes_the_gemv_for_float32_logits(monkeypatch, rows):
    """With ENGINE_GEMV_LM_HEAD=1 the LM head's one-row logits come from the GEMV in
    float32, holding the weight dtype's rounding (as the library GEMM then .float());
    rows the GEMV declines (3 rows of a wide head) keep the library GEMM."""
    from engine_sdk.layers import embedding

    monkeypatch.setenv("ENGINE_GEMV_LM_HEAD", "1")
    embedding.lm_head_gemv.cache_clear()
    calls = []
    real = gemv.gemv
    monkeypatch.setattr(gemv, "gemv", lambda *a, **kw: calls.append(kw) or real(*a, **kw))
    try:
        head = embedding.LMHead(300, 64, torch.bfloat16).to(DEVICE)
        gen = torch.Generator().manual_seed(rows)
        head.weight.data.copy_(torch.randn(300, 64, generator=gen).to(torch.bfloat16))
        x = torch.randn(rows, 64, generator=gen).to(torch.bfloat16).to(DEVICE)
        got = head(x)
    finally:
        embedding.lm_head_gemv.cache_clear()
    want = torch.nn.functional.linear(x, head.weight).float()
    assert got.dtype == torch.float32 and got.shape == (rows, 300)
    assert len(calls) == (1 if rows == 1 else 0)
    assert torch.equal(got, got.to(torch.bfloat16).float())  # rounded to bf16 first
    # float32 sums in another order: at most one bf16 ulp apart
    assert bool(((got - want).abs() <= want.abs() * torch.finfo(torch.bfloat16).eps + 1e-6).all())


def _fp8_weight(n: int, k: int, gen: torch.Generator, per_row: bool):
    """An e4m3 weight and its float32 scale (one, or [N, 1]) and the dequantized float32
    weight they stand for."""
    w = torch.randn(n, k, generator=gen) * (1 + torch.arange(n)[:, None] % 5)
    amax = w.abs().amax(1, keepdim=True) if per_row else w.abs().amax().reshape(1)
    scale = (amax / 448.0).float()
    q = (w / scale).to(torch.float8_e4m3fn)
    return q.to(DEVICE), scale.to(DEVICE), q.float() * scale


@pytest.mark.parametrize("per_row", [False, True])
@pytest.mark.parametrize("rows,n,k,bias", [(1, 33, 70, False), (3, 24, 1030, True)])
def test_gemv_with_a_float8_weight_applies_its_scale(rows, n, k, bias, per_row):
    """An e4m3 weight with a tensor or per-row scale: the float32 sum of x times the
    codes, times the scale, plus the bias, rounded once to x's dtype. A kernel that skips
    or misplaces the scale (row n taking row 0's) is off by the scales' spread (1-5x)."""
    gen = torch.Generator().manual_seed(rows + n + k + per_row)
    q, scale, deq = _fp8_weight(n, k, gen, per_row)
    x = torch.randn(rows, k, generator=gen).to(torch.bfloat16).to(DEVICE)
    b = torch.randn(n, generator=gen).to(torch.bfloat16).to(DEVICE) if bias else None
    assert gemv.weight_scale_mode(q, scale) == (2 if per_row else 1)
    assert gemv.use_gemv(x, q, scale) and not gemv.use_gemv(x, q)  # no scale: not fp8's
    ref = x.float().cpu() @ deq.T + (b.float().cpu() if b is not None else 0)
    got = gemv.gemv(x, q, b, scale=scale)
    assert got.shape == (rows, n) and got.dtype == torch.bfloat16
    err = (got.float().cpu() - ref).abs()
    assert bool((err <= _ulp_tol(ref, torch.bfloat16)).all()), err.max()


def test_weight_scale_mode_declines_block_scales_and_other_formats():
    q = torch.zeros(8, 32, dtype=torch.float8_e4m3fn)
    assert gemv.weight_scale_mode(q, torch.ones(2, 1)) is None  # tiles, not rows
    assert gemv.weight_scale_mode(q, torch.ones(8, 1, dtype=torch.float16)) is None
    assert gemv.weight_scale_mode(q.to(torch.float8_e5m2), torch.ones(1)) is None
    assert gemv.weight_scale_mode(q, None) is None  # fp8 codes need their scale
    assert gemv.weight_scale_mode(torch.zeros(8, 32, dtype=torch.bfloat16), None) == 0


@pytest.mark.parametrize("gated", [False, True])
def test_gemv_add_rms_norm_with_a_float8_weight(gated):
    """The add+RMSNorm launch (and its gated SiLU form) over an e4m3 weight with per-row
    scales equals the float32 reference of norm, dequantized projection (gate and up
    rounded to the dtype), SiLU-and-mul; the new residual is exact."""
    rows, inter, k = 2, 21, 300  # odd: the last program of 2 or 4 rows is masked
    n = 2 * inter
    gen = torch.Generator().manual_seed(5 + gated)
    q, scale, deq = _fp8_weight(n, k, gen, per_row=True)
    x = (torch.randn(rows, k, generator=gen) * 2).to(torch.bfloat16).to(DEVICE)
    residual = torch.randn(rows, k, generator=gen).to(torch.bfloat16).to(DEVICE)
    norm_w = (1 + 0.1 * torch.randn(k, generator=gen)).to(torch.bfloat16).to(DEVICE)
    from engine_sdk.layers import fused_ops

    normed, want_res = fused_ops.add_rms_norm(x, residual, norm_w, 1e-6)  # same roundings
    h = normed.float().cpu()
    proj = h @ deq.T
    got, got_res = gemv.gemv_add_rms_norm(x, residual, norm_w, 1e-6, q, gated=gated, scale=scale)
    assert torch.equal(got_res, want_res)
    if gated:
        g, u = proj.bfloat16().float().chunk(2, dim=-1)
        want = g * torch.sigmoid(g) * u
        tol = 4 * torch.finfo(torch.bfloat16).eps * (want.abs() + g.abs() * u.abs()) + 1e-2
    else:
        want = proj
        tol = 4 * torch.finfo(torch.bfloat16).eps * (h.abs() @ deq.abs().T) + 1e-3
    assert got.shape == want.shape
    assert bool(((got.float().cpu() - want).abs() <= tol).all())


def test_float8_launches_take_twice_bf16s_rows_a_program(monkeypatch):
    """A float8 weight's add+RMSNorm and gated launches give each program twice bf16's
    weight rows (the same bytes a program: FP8_BLOCK_N, FP8_GATED_BLOCK_N), and the grid
    covers the output with them; bf16 keeps its own. A float8 gated launch that fell back
    to bf16's GATED_BLOCK_N would run twice the programs it should."""
    launches: list[tuple[tuple[int, ...], int, bool]] = []

    class Launcher:
        def __getitem__(self, grid):
            return lambda *args, **kw: launches.append((grid, kw["BLOCK_N"], kw["GATED"]))

    monkeypatch.setattr(gemv, "_norm_kernel", lambda: Launcher())
    gen = torch.Generator().manual_seed(3)
    inter, k = 21, 64
    q, scale, deq = _fp8_weight(2 * inter, k, gen, per_row=True)
    x = torch.randn(1, k, generator=gen).to(torch.bfloat16)
    norm_w = torch.ones(k, dtype=torch.bfloat16)
    for weight, w_scale in ((q.cpu(), scale.cpu()), (deq.to(torch.bfloat16), None)):
        for gated in (False, True):
            gemv.gemv_add_rms_norm(x, x, norm_w, 1e-6, weight, gated=gated, scale=w_scale)
    (fp8_norm, fp8_gated, bf16_norm, bf16_gated) = launches
    assert fp8_norm[1] == gemv.FP8_BLOCK_N == 2 * bf16_norm[1]
    assert fp8_gated[1] == gemv.FP8_GATED_BLOCK_N == 2 * gemv.GATED_BLOCK_N == 2 * bf16_gated[1]
    assert [g for _, _, g in launches] == [False, True, False, True]
    for grid, block_n, gated in launches:  # every output row (gate row when gated) once
        rows = inter if gated else 2 * inter
        assert grid == (-(-rows // block_n),)
