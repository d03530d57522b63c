"""LoRA at decode inside the GEMV: the expand in the GEMV's epilogue and the shrink over
the fused add+RMSNorm's rows, against the separate kernels' references (Triton's
interpreter on CPU, the compiled kernels on a GPU)."""

from __future__ import annotations

import pytest
import torch
from engine_sdk.layers import gemv, lora
from engine_sdk.layers.linear import Linear
from engine_sdk.layers.lora import LoRAContext, LoRALayer, LoRASlices

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
DTYPES = [torch.bfloat16, torch.float16]


@pytest.fixture(autouse=True)
def _force_kernels(monkeypatch):
    if DEVICE == "cpu":
        monkeypatch.setenv("ENGINE_GEMV", "force")
        monkeypatch.setenv("ENGINE_LORA_KERNELS", "force")
    lora._kernels.cache_clear()
    lora._forced.cache_clear()
    yield
    lora._kernels.cache_clear()
    lora._forced.cache_clear()


def _adapters(gen, slots, k, sizes, rank, dtype):
    """Random slot weights: A [slots, S*rank, k], B [slots, sum(sizes), rank]."""
    a = (torch.randn(slots, len(sizes) * rank, k, generator=gen) / k**0.5).to(dtype)
    b = torch.randn(slots, sum(sizes), rank, generator=gen).to(dtype)
    return a.to(DEVICE), b.to(DEVICE)


def _expanded(y, h, b, slots, slices) -> torch.Tensor:
    """The separate expand's result on ``y`` (float32 sum, one rounding)."""
    out = y.clone()
    lora.lora_expand_reference(out, h, b, slots, slices)
    return out


@pytest.fixture(params=[2, 8], ids=["block_n2", "block_n8"])
def lora_block_n(request, monkeypatch):
    """Weight rows per program of the GEMVs with the epilogue (``ENGINE_LORA_GEMV_BLOCK_N``):
    the default, and wider tiles that straddle more slices."""
    monkeypatch.setattr(gemv, "LORA_BLOCK_N", request.param)
    return request.param


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize(
    "rows,sizes,rank,k,num_parts,row_slots",
    [
        (1, (40,), 16, 64, 1, [1]),
        (3, (33, 16, 15), 8, 300, 3, [0, -1, 2]),  # 2-column tiles straddle the slices
        (4, (24, 24), 4, 256, 2, [2, 2, -1, 0]),
        (2, (7,), 16, 512, 4, [-1, -1]),  # no adapter row: the base GEMV unchanged
    ],
)
def test_gemv_epilogue_equals_gemv_then_expand(
    rows, sizes, rank, k, num_parts, row_slots, dtype, lora_block_n
):
    gen = torch.Generator().manual_seed(rows * 7 + k + rank)
    n = sum(sizes)
    x = torch.randn(rows, k, generator=gen).to(dtype).to(DEVICE)
    w = (torch.randn(n, k, generator=gen) / k**0.5).to(dtype).to(DEVICE)
    bias = torch.randn(n, generator=gen).to(dtype).to(DEVICE)
    a, b = _adapters(gen, 3, k, sizes, rank, dtype)
    slots = torch.tensor(row_slots, dtype=torch.int32, device=DEVICE)
    slices = LoRASlices(sizes, DEVICE)
    parts = lora.lora_shrink_triton(x, a, slots, blocked=False, parts=True, num_parts=num_parts)
    assert parts.shape[0] == num_parts
    epilogue = gemv.LoRAEpilogue(parts, b, slots, slices.starts, len(sizes))
    got = gemv.gemv(x, w, bias, lora=epilogue)
    base = x.float() @ w.float().T + bias.float()
    want = base + (_expanded(torch.zeros_like(base), parts.sum(0), b, slots, slices))
    # one rounding of the sum (the separate kernels round twice): half an ulp and slack
    tol = want.abs() * torch.finfo(dtype).eps + 2e-3
    assert bool(((got.float() - want).abs() <= tol).all()), (got.float() - want).abs().max()
    adapter_rows = [i for i, s in enumerate(row_slots) if s >= 0]
    if adapter_rows:  # the delta is there (an epilogue that adds nothing fails)
        delta = (want - base)[adapter_rows].abs().max()
        assert delta > 10 * tol.max()
    plain = gemv.gemv(x, w, bias)
    base_rows = [i for i, s in enumerate(row_slots) if s < 0]
    assert torch.equal(got[base_rows], plain[base_rows])


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize(
    "rows,k,sizes,num_parts,row_slots",
    [
        (1, 512, (32, 16, 16), 4, [0]),
        (3, 200, (48,), 2, [1, -1, 0]),
        (2, 1030, (20, 20), 3, [1, 1]),
    ],
)
def test_shrink_over_the_fused_norm_and_the_norm_gemv_epilogue(
    rows, k, sizes, num_parts, row_slots, dtype, lora_block_n
):
    """The shrink that normalizes x + residual itself gives the parts of the separate
    shrink over add_rms_norm's output; the norm GEMV with the epilogue equals add_rms_norm,
    the GEMV and the expand, and still returns the residual bit for bit."""
    from engine_sdk.layers import fused_ops

    gen = torch.Generator().manual_seed(rows + k)
    rank, n = 16, sum(sizes)
    x = (torch.randn(rows, k, generator=gen) * 2).to(dtype).to(DEVICE)
    residual = torch.randn(rows, k, generator=gen).to(dtype).to(DEVICE)
    norm_w = (1 + 0.1 * torch.randn(k, generator=gen)).to(dtype).to(DEVICE)
    w = (torch.randn(n, k, generator=gen) / k**0.5).to(dtype).to(DEVICE)
    a, b = _adapters(gen, 2, k, sizes, rank, dtype)
    slots = torch.tensor(row_slots, dtype=torch.int32, device=DEVICE)
    slices = LoRASlices(sizes, DEVICE)

    normed, want_res = fused_ops.add_rms_norm(x, residual, norm_w, 1e-6)
    parts = lora.lora_shrink_add_rms_norm_triton(
        x, residual, norm_w, 1e-6, a, slots, num_parts=num_parts
    )
    assert parts.shape == (num_parts, rows, len(sizes) * rank)
    h_want = lora.lora_shrink_reference(normed, a, slots)
    # an ulp of a normalized value may differ (the variance's sum order)
    h_tol = 4 * torch.finfo(dtype).eps * (normed.float().abs() @ a.float().abs().flatten(0, 1).T)
    h_tol = h_tol.view(rows, 2, -1).amax(1)
    assert bool(((parts.sum(0) - h_want).abs() <= h_tol + 1e-4).all())

    epilogue = gemv.LoRAEpilogue(parts, b, slots, slices.starts, len(sizes))
    got, got_res = gemv.gemv_add_rms_norm(x, residual, norm_w, 1e-6, w, None, epilogue)
    assert torch.equal(got_res, want_res)
    base = normed.float() @ w.float().T
    want = base + _expanded(torch.zeros_like(base), h_want, b, slots, slices)
    tol = 4 * torch.finfo(dtype).eps * (normed.float().abs() @ w.float().abs().T) + 0.02
    assert bool(((got.float() - want).abs() <= tol).all()), (got.float() - want).abs().max()
    assert (want - base).abs().max() > 10 * tol.max()  # the delta matters at this tolerance


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize(
    "rows,inter,rank,num_parts,row_slots",
    [(1, 96, 16, 1, [1]), (3, 300, 8, 2, [0, -1, 1]), (2, 1100, 24, None, [-1, 1])],
)
def test_silu_and_mul_with_the_down_shrink(monkeypatch, rows, inter, rank, num_parts, row_slots,
                                           dtype):  # fmt: skip
    """One launch gives the activation of the separate kernel bit for bit and the parts of
    the separate shrink over it (zeros for a row without adapter)."""
    from engine_sdk.layers import fused_ops

    monkeypatch.setenv("ENGINE_FUSED_OPS", "force")
    gen = torch.Generator().manual_seed(rows + inter)
    gate_up = (torch.randn(rows, 2 * inter, generator=gen) * 2).to(dtype).to(DEVICE)
    a, _ = _adapters(gen, 2, inter, (8,), rank, dtype)
    slots = torch.tensor(row_slots, dtype=torch.int32, device=DEVICE)
    act, parts = lora.silu_and_mul_lora_shrink_triton(gate_up, a, slots, num_parts)
    assert torch.equal(act, fused_ops.silu_and_mul_merged(gate_up))
    assert parts.shape[1:] == (rows, rank) and (num_parts is None or parts.shape[0] == num_parts)
    want = lora.lora_shrink_reference(act, a, slots)
    torch.testing.assert_close(parts.sum(0), want.float(), atol=1e-3, rtol=1e-3)
    assert want.abs().max() > 0.1
    for i, slot in enumerate(row_slots):
        if slot < 0:
            assert not parts[:, i].any()


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize(
    "rows,inter,rank,gu_parts,row_slots",
    [(1, 96, 16, 3, [1]), (3, 300, 8, 2, [0, -1, 1]), (2, 1100, 16, 5, [-1, 1])],
)
def test_silu_and_mul_adds_the_deferred_gate_up_expand(
    monkeypatch, rows, inter, rank, gu_parts, row_slots, dtype
):
    """With the gate/up adapter's expand deferred to it, the activation's kernel gives the
    activation of the separate expand then the separate activation bit for bit (each
    rounding at its place; the deltas here are sums of eighths, exact in any order), and
    the down shrink over that activation."""
    from engine_sdk.layers import fused_ops

    monkeypatch.setenv("ENGINE_FUSED_OPS", "force")
    gen = torch.Generator().manual_seed(rows * 3 + inter)
    gate_up = (torch.randn(rows, 2 * inter, generator=gen) * 2).to(dtype).to(DEVICE)
    a_down, _ = _adapters(gen, 2, inter, (8,), rank, dtype)
    b_gu = torch.randint(-2, 3, (2, 2 * inter, rank), generator=gen).to(dtype).to(DEVICE)
    slots = torch.tensor(row_slots, dtype=torch.int32, device=DEVICE)
    gu_slices = LoRASlices((inter, inter), DEVICE)
    parts_gu = torch.randint(-2, 3, (gu_parts, rows, 2 * rank), generator=gen) / 8
    parts_gu = parts_gu.float().to(DEVICE)
    parts_gu[:, slots.cpu() < 0] = 0.0  # the shrink writes zeros for rows without adapter
    pending = gemv.LoRAEpilogue(parts_gu, b_gu, slots, gu_slices.starts, 2)

    act, parts = lora.silu_and_mul_lora_shrink_triton(gate_up, a_down, slots, gate_up_lora=pending)
    delta = torch.zeros(rows, 2 * inter, device=DEVICE)
    exact_delta = _expanded(delta, parts_gu.sum(0), b_gu, slots, gu_slices)  # float32, exact
    expanded = _round_as_kernels(gate_up.float() + exact_delta, dtype)
    want = fused_ops.silu_and_mul_merged(expanded)
    assert torch.equal(act, want), (act.float() - want.float()).abs().max()
    plain = fused_ops.silu_and_mul_merged(gate_up)
    for i, slot in enumerate(row_slots):  # the delta is there, and only for adapter rows
        assert torch.equal(act[i], plain[i]) == (slot < 0)
    want_parts = lora.lora_shrink_reference(act, a_down, slots)
    torch.testing.assert_close(parts.sum(0), want_parts.float(), atol=1e-3, rtol=1e-3)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("rows,row_slots", [(1, [1]), (3, [0, -1, 1])])
def test_deferred_norm_gemv_writes_the_shrink_and_no_expand(rows, row_slots, dtype):
    """``Linear.lora_add_rms_norm_deferred``: the GEMV's output is the base GEMV's bit for
    bit (no expand in it), the residual too, and its first programs wrote the shrink over
    the normalized rows that the separate shrink gives."""
    from engine_sdk.layers import fused_ops

    k, sizes, rank = 256, (48, 48), 16
    layer = _lora_linear(k, sizes, rank, dtype, row_slots, seed=rows + 11)
    gen = torch.Generator().manual_seed(rows)
    x = torch.randn(rows, k, generator=gen).to(dtype).to(DEVICE)
    residual = torch.randn(rows, k, generator=gen).to(dtype).to(DEVICE)
    norm_w = (1 + 0.1 * torch.randn(k, generator=gen)).to(dtype).to(DEVICE)
    result = layer.lora_add_rms_norm_deferred(x, residual, norm_w, 1e-6)
    assert result is not None
    out, new_residual, pending = result
    base, want_res = gemv.gemv_add_rms_norm(x, residual, norm_w, 1e-6, layer.weight, layer.bias)
    assert torch.equal(out, base) and torch.equal(new_residual, want_res)
    assert not pending.expand and pending.shrink is not None
    normed, _ = fused_ops.add_rms_norm(x, residual, norm_w, 1e-6)
    slots = torch.tensor(row_slots, dtype=torch.int32, device=DEVICE)
    h_want = lora.lora_shrink_reference(normed, layer.lora.lora_a, slots)
    h_tol = (
        4
        * torch.finfo(dtype).eps
        * (normed.float().abs() @ layer.lora.lora_a.float().abs().flatten(0, 1).T)
    )
    h_tol = h_tol.view(rows, 2, -1).amax(1)
    assert bool(((pending.parts.sum(0) - h_want).abs() <= h_tol + 1e-4).all())
    assert h_want.abs().max() > 0.1


def _round_as_kernels(x: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """``x`` (float32) rounded to ``dtype`` as the Triton kernels round it here: to nearest
    even on a GPU; Triton's interpreter truncates to bfloat16."""
    if DEVICE == "cpu" and dtype == torch.bfloat16:
        return (x.view(torch.int32) & ~0xFFFF).view(torch.float32).to(dtype)
    return x.to(dtype)


def _lora_linear(k, sizes, rank, dtype, row_slots, seed):
    gen = torch.Generator().manual_seed(seed)
    layer = Linear(k, sum(sizes), bias=True, params_dtype=dtype)
    layer.weight.data.copy_(torch.randn(sum(sizes), k, generator=gen) / k**0.5)
    layer.bias.data.copy_(torch.randn(sum(sizes), generator=gen))
    layer = layer.to(DEVICE)
    context = LoRAContext(8, DEVICE)
    layer.lora = LoRALayer(context, 2, rank, k, sizes, dtype, DEVICE)
    a, b = _adapters(gen, 2, k, sizes, rank, dtype)
    layer.lora.lora_a.copy_(a)
    layer.lora.lora_b.copy_(b)
    context.token_slots[: len(row_slots)] = torch.tensor(row_slots, dtype=torch.int32)
    context.active = True
    return layer


def test_linear_runs_one_gemv_with_the_epilogue_at_decode(monkeypatch):
    """Two decode rows with adapters: one shrink and one GEMV carrying the expand (no
    separate expand launch), equal to the library GEMM and the reference LoRA."""
    layer = _lora_linear(96, (32, 16), 8, torch.bfloat16, [1, 0], seed=5)
    x = torch.randn(2, 96, generator=torch.Generator().manual_seed(1)).to(torch.bfloat16)
    x = x.to(DEVICE)
    calls = {"gemv_lora": 0, "expand": 0}
    gemv_fn, expand_fn = gemv.gemv, lora.lora_expand_triton

    def counting_gemv(*args, **kwargs):
        calls["gemv_lora"] += kwargs.get("lora") is not None
        return gemv_fn(*args, **kwargs)

    def counting_expand(*args, **kwargs):
        calls["expand"] += 1
        return expand_fn(*args, **kwargs)

    monkeypatch.setattr(gemv, "gemv", counting_gemv)
    monkeypatch.setattr(lora, "lora_expand_triton", counting_expand)
    got = layer(x)
    assert calls == {"gemv_lora": 1, "expand": 0}
    monkeypatch.setenv("ENGINE_GEMV", "0")
    monkeypatch.setenv("ENGINE_LORA_KERNELS", "0")
    lora._kernels.cache_clear()
    want = layer(x)  # the library GEMM, then the torch reference LoRA
    assert calls == {"gemv_lora": 1, "expand": 0}
    torch.testing.assert_close(got.float(), want.float(), atol=0.03, rtol=0.02)
    layer.lora.context.active = False
    assert (layer(x).float() - want.float()).abs().max() > 0.1  # the adapters mattered


@pytest.mark.skipif(DEVICE == "cuda", reason="the SDK's dense test attention runs on the CPU")
@pytest.mark.parametrize("mode", ["shrink_launches", "shrink_in_gemv", "expand_in_act"])
def test_decoder_with_adapters_takes_the_fused_kernels_at_decode(monkeypatch, tmp_path, mode):
    """One token with an adapter through a tiny bf16 Qwen3: q/k/v and gate/up run the
    norm GEMV with the epilogue, o and down the plain GEMV with it, and the logits equal
    the unfused path (library GEMMs and the reference LoRA) and differ from the base's.
    With ``ENGINE_LORA_SHRINK_IN_GEMV=1`` no shrink runs as a launch of its own (down's
    is in the activation's kernel, the others inside their GEMVs). With
    ``ENGINE_LORA_EXPAND_IN_ACT=1`` gate/up's shrink is inside its GEMV and its expand in
    the activation's kernel: q/k/v and o keep their shrink launches."""
    from tiny_decoder import tiny_bf16_qwen3

    in_gemv = mode == "shrink_in_gemv"
    monkeypatch.setenv("ENGINE_LORA_SHRINK_IN_GEMV", "1" if in_gemv else "0")
    monkeypatch.setenv("ENGINE_LORA_EXPAND_IN_ACT", "1" if mode == "expand_in_act" else "0")
    shrink_launches = []
    for name in ("lora_shrink_triton", "lora_shrink_add_rms_norm_triton"):
        original = getattr(lora, name)

        def counted(*args, _original=original, **kwargs):
            shrink_launches.append(1)
            return _original(*args, **kwargs)

        monkeypatch.setattr(lora, name, counted)

    model, logits = tiny_bf16_qwen3(tmp_path, DEVICE)
    context = LoRAContext(8, DEVICE)
    gen = torch.Generator().manual_seed(9)
    targets = lora.lora_target_layers(model)
    for layer in dict.fromkeys(targets.values()):
        sizes = [size for _, size in layer.parts]
        layer.lora = LoRALayer(context, 2, 8, layer.input_size, sizes, torch.bfloat16, DEVICE)
        a, b = _adapters(gen, 2, layer.input_size, sizes, 8, torch.bfloat16)
        layer.lora.lora_a.copy_(a)
        layer.lora.lora_b.copy_(b * 0.5)
    context.token_slots[0] = 1
    context.active = True
    calls = {"norm_epilogue": 0, "gemv_epilogue": 0}
    norm_fn, gemv_fn = gemv.gemv_add_rms_norm, gemv.gemv

    def norm(*args, **kwargs):
        calls["norm_epilogue"] += (len(args) > 6 and args[6] is not None) or "lora" in kwargs
        return norm_fn(*args, **kwargs)

    def plain(*args, **kwargs):
        calls["gemv_epilogue"] += kwargs.get("lora") is not None
        return gemv_fn(*args, **kwargs)

    silu_fn = lora.silu_and_mul_lora_shrink_triton

    deferred = []

    def silu_shrink(*args, **kwargs):
        calls["silu_shrink"] += 1
        deferred.append(kwargs.get("gate_up_lora") is not None)
        return silu_fn(*args, **kwargs)

    monkeypatch.setattr(gemv, "gemv_add_rms_norm", norm)
    monkeypatch.setattr(gemv, "gemv", plain)
    monkeypatch.setattr(lora, "silu_and_mul_lora_shrink_triton", silu_shrink)
    calls["silu_shrink"] = 0
    num_layers = len(model.model.layers)

    fused = logits()
    # q/k/v of every layer but the first (no residual yet) and every gate/up; o and down
    # plain, and the first layer's q/k/v; down's shrink inside the activation's kernel
    assert calls == {
        "norm_epilogue": 2 * num_layers - 1,
        "gemv_epilogue": 2 * num_layers + 1,
        "silu_shrink": num_layers,
    }
    # one shrink launch per q/k/v, o and gate/up projection, or none, or gate/up's not
    per_layer = {"shrink_launches": 3, "shrink_in_gemv": 0, "expand_in_act": 2}[mode]
    assert len(shrink_launches) == per_layer * num_layers
    assert deferred == [mode == "expand_in_act"] * num_layers
    monkeypatch.setenv("ENGINE_GEMV", "0")
    monkeypatch.setenv("ENGINE_LORA_KERNELS", "0")
    lora._kernels.cache_clear()
    unfused = logits()
    torch.testing.assert_close(fused, unfused, atol=0.05, rtol=0.05)
    context.active = False
    base = logits()
    assert (base - unfused).abs().max() > 0.2


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("norm", [False, True], ids=["plain", "add_rms_norm"])
@pytest.mark.parametrize(
    "rows,k,sizes,rank,row_slots",
    [
        (1, 1200, (48, 16, 16), 16, [1]),  # 3 rank blocks x 3 parts of K (512, 512, 176)
        (3, 300, (40,), 8, [0, -1, 2]),  # one slice, a rank below a block, a base row
        (4, 256, (24, 24), 16, [-1, -1, -1, -1]),  # no adapter row: the GEMV unchanged
    ],
)
def test_shrink_inside_the_gemv_launch(rows, k, sizes, rank, row_slots, norm, dtype):
    """``LoRALayer.epilogue_in_gemv``: the GEMV's first programs compute the shrink that
    its other programs' epilogues add (no launch before the GEMV); the outputs are those
    of the shrink launched first, and the layer's counters are back at zero after each
    launch, so the next one (or a graph replay) starts clean."""
    from engine_sdk.layers import fused_ops

    gen = torch.Generator().manual_seed(rows * 13 + k)
    n = sum(sizes)
    context = LoRAContext(8, DEVICE)
    layer = LoRALayer(context, 3, rank, k, sizes, dtype, DEVICE)
    a, b = _adapters(gen, 3, k, sizes, rank, dtype)
    layer.lora_a.copy_(a)
    layer.lora_b.copy_(b)
    context.active = True
    context.token_slots[:rows] = torch.tensor(row_slots, dtype=torch.int32)
    x = (torch.randn(rows, k, generator=gen) * 2).to(dtype).to(DEVICE)
    residual = torch.randn(rows, k, generator=gen).to(dtype).to(DEVICE)
    norm_w = (1 + 0.1 * torch.randn(k, generator=gen)).to(dtype).to(DEVICE)
    w = (torch.randn(n, k, generator=gen) / k**0.5).to(dtype).to(DEVICE)

    in_gemv = layer.epilogue_in_gemv(x)
    assert in_gemv.shrink is not None
    assert in_gemv.shrink.num_programs == -(-len(sizes) * rank // 16) * in_gemv.parts.shape[0]
    for _ in range(2):
        if norm:
            got, got_res = gemv.gemv_add_rms_norm(x, residual, norm_w, 1e-6, w, None, in_gemv)
            normed, want_res = fused_ops.add_rms_norm(x, residual, norm_w, 1e-6)
            assert torch.equal(got_res, want_res)
            before = lora.lora_shrink_add_rms_norm_triton(
                x, residual, norm_w, 1e-6, a, layer.context.token_slots[:rows]
            )
        else:
            got = gemv.gemv(x, w, None, lora=in_gemv)
            normed = x
            before = lora.lora_shrink_triton(
                x, a, layer.context.token_slots[:rows], blocked=False, parts=True
            )
        assert not layer.gemv_flags.any()  # both counters back at zero
        slots = layer.context.token_slots[:rows]
        h = lora.lora_shrink_reference(normed, a, slots)
        torch.testing.assert_close(in_gemv.parts.sum(0), h, atol=2e-3, rtol=2e-3)
        torch.testing.assert_close(in_gemv.parts.sum(0), before.sum(0), atol=2e-3, rtol=2e-3)
        base = normed.float() @ w.float().T
        want = base + _expanded(torch.zeros_like(base), h, b, slots, layer.slices)
        tol = 4 * torch.finfo(dtype).eps * (normed.float().abs() @ w.float().abs().T) + 0.02
        assert bool(((got.float() - want).abs() <= tol).all()), (got.float() - want).abs().max()
        adapter_rows = [i for i, s in enumerate(row_slots) if s >= 0]
        if adapter_rows:
            assert (want - base)[adapter_rows].abs().max() > 10 * tol.max()
