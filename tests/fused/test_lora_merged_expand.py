"""The expand of a merged projection (q/k/v, gate/up) in one launch over all slices:
Triton kernels (interpreter on CPU) against the torch reference and a per-token loop, with
mixed slots (-1, several adapters, ranks padded to the max rank), uneven slices (GQA:
q 64, k/v 32), partial column tiles, bf16 and fp32; and a check that each slice's columns
take only that slice's ``B`` rows and rank block of ``h``."""

from __future__ import annotations

import pytest
import torch
from engine_sdk.layers import _lora_kernels
from engine_sdk.layers.lora import (
    LoRAContext,
    LoRALayer,
    LoRASlices,
    lora_expand_reference,
    lora_expand_triton,
    lora_shrink_reference,
    lora_shrink_triton,
)

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
BLOCKED = pytest.mark.parametrize("blocked", [False, True], ids=["per-token", "blocked"])
# q 64 + k/v 32 (GQA); sizes off the tile size (40: q's tile runs into k's columns unless
# masked); gate/up; one slice
SIZES = [(64, 32, 32), (40, 24, 24), (48, 48), (72,)]
TOLERANCE = {torch.float32: 1e-4, torch.bfloat16: 3e-2}


def _layer(sizes, dtype, num_slots=3, max_rank=8, k=40, seed=0):
    """A layer with adapters of ranks 8, 4 and 2 in slots 0..2 (padded to 8); slot 1
    leaves its second slice alone. Returns the layer and each slot's (A, B) per slice."""
    gen = torch.Generator().manual_seed(seed)
    layer = LoRALayer(LoRAContext(64, DEVICE), num_slots, max_rank, k, sizes, dtype, DEVICE)
    adapters = {}
    for slot, rank in zip(range(num_slots), (8, 4, 2), strict=False):
        pairs = [
            (torch.randn(rank, k, generator=gen) * 0.3, torch.randn(n, rank, generator=gen) * 0.3)
            for n in sizes
        ]
        if slot == 1 and len(sizes) > 1:
            pairs[1] = None  # type: ignore[call-overload]
        adapters[slot] = pairs
        layer.set_slot(
            slot, [None if p is None else (p[0].to(dtype), p[1].to(dtype)) for p in pairs]
        )
    return layer, adapters


def _slots(num_tokens, num_slots, seed):
    gen = torch.Generator().manual_seed(seed)
    slots = torch.randint(-1, num_slots, (num_tokens,), generator=gen, dtype=torch.int32)
    slots[: min(num_tokens, 20)] = 0  # a run of one adapter, as a prefill chunk gives
    slots[-1] = -1
    return slots.to(DEVICE)


def _loop(layer, adapters, x, y0, slots):
    """The per-token, per-slice definition, in float32."""
    want = y0.float().cpu().clone()
    for t, s in enumerate(slots.tolist()):
        if s < 0:
            continue
        offset = 0
        for n, pair in zip(layer.slice_sizes, adapters[s], strict=True):
            if pair is not None:
                a, b = (w.to(layer.lora_a.dtype).float() for w in pair)
                want[t, offset : offset + n] += b @ (a @ x[t].float().cpu())
            offset += n
    return want


@BLOCKED
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize("sizes", SIZES, ids=lambda s: "-".join(map(str, s)))
@pytest.mark.parametrize("num_tokens", [1, 37])
def test_one_launch_expand_matches_reference(num_tokens, sizes, dtype, blocked):
    layer, adapters = _layer(sizes, dtype)
    gen = torch.Generator().manual_seed(7)
    x = torch.randn(num_tokens, 40, generator=gen).to(dtype).to(DEVICE)
    y0 = torch.randn(num_tokens, sum(sizes), generator=gen).to(dtype).to(DEVICE)
    slots = _slots(num_tokens, 3, seed=num_tokens)

    h_ref = lora_shrink_reference(x, layer.lora_a, slots)
    h_tri = lora_shrink_triton(x, layer.lora_a, slots, blocked=blocked)
    tol = TOLERANCE[dtype]
    torch.testing.assert_close(h_tri.cpu(), h_ref.cpu(), atol=tol, rtol=tol)
    y_ref, y_tri = y0.clone(), y0.clone()
    lora_expand_reference(y_ref, h_ref, layer.lora_b, slots, layer.slices)
    lora_expand_triton(y_tri, h_ref, layer.lora_b, slots, layer.slices, blocked=blocked)
    torch.testing.assert_close(y_tri.float().cpu(), y_ref.float().cpu(), atol=tol, rtol=tol)
    want = _loop(layer, adapters, x, y0, slots)
    torch.testing.assert_close(y_ref.float().cpu(), want, atol=2 * tol, rtol=2 * tol)
    # tokens without an adapter keep their base output bit for bit
    assert torch.equal(y_tri[slots < 0], y0[slots < 0])


@BLOCKED
@pytest.mark.parametrize("sizes", SIZES[:3], ids=lambda s: "-".join(map(str, s)))
@pytest.mark.parametrize("only", ["b", "h"])
def test_each_slice_reads_only_its_own_b_and_rank_block(sizes, only, blocked):
    """Only slice ``i`` has a nonzero ``B`` (or rank block of ``h``): exactly slice ``i``'s
    columns change, by ``h_i @ B_i.T``. A tile mapped to the wrong slice, or a tile writing
    past its slice's end, changes other columns or leaves these at zero."""
    num_tokens, rank, num_slots = 19, 4, 2
    gen = torch.Generator().manual_seed(3)
    total = sum(sizes)
    slices = LoRASlices(sizes, DEVICE)
    slots = _slots(num_tokens, num_slots, seed=5)
    starts = [0, *torch.tensor(sizes).cumsum(0).tolist()]
    for i in range(len(sizes)):
        cols = slice(starts[i], starts[i + 1])
        b = torch.randn(num_slots, total, rank, generator=gen) + 1.0
        h = torch.randn(num_tokens, len(sizes) * rank, generator=gen) + 1.0
        if only == "b":
            keep = torch.zeros_like(b)
            keep[:, cols] = 1.0
            b = b * keep
        else:
            keep = torch.zeros_like(h)
            keep[:, i * rank : (i + 1) * rank] = 1.0
            h = h * keep
        b, h = b.to(DEVICE), h.to(DEVICE)
        y = torch.zeros(num_tokens, total, device=DEVICE)
        lora_expand_triton(y, h, b, slots, slices, blocked=blocked)
        changed = y.cpu() != 0
        assert not changed[:, : cols.start].any() and not changed[:, cols.stop :].any()
        assert changed[slots.cpu() >= 0][:, cols].all()
        want = torch.zeros(num_tokens, total)
        for t, s in enumerate(slots.tolist()):
            if s >= 0:
                want[t, cols] = h[t, i * rank : (i + 1) * rank].cpu() @ b[s, cols].cpu().T
        torch.testing.assert_close(y.cpu(), want, atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("blocked", [False, True], ids=["per-token", "blocked"])
def test_a_merged_layer_launches_one_shrink_and_one_expand(monkeypatch, blocked):
    counts: dict[str, int] = {}

    class Counting:
        def __init__(self, name, kernel):
            self.name, self.kernel = name, kernel

        def __getitem__(self, grid):
            counts[self.name] = counts.get(self.name, 0) + 1
            return self.kernel[grid]

    for name in (
        "lora_shrink_kernel", "lora_expand_kernel",
        "lora_shrink_blocked_kernel", "lora_expand_blocked_kernel",
    ):  # fmt: skip
        monkeypatch.setattr(_lora_kernels, name, Counting(name, getattr(_lora_kernels, name)))
    layer, _ = _layer((64, 32, 32), torch.float32)
    x = torch.randn(9, 40).to(DEVICE)
    slots = _slots(9, 3, seed=1)
    y = torch.zeros(9, 128, device=DEVICE)
    h = lora_shrink_triton(x, layer.lora_a, slots, blocked=blocked)
    lora_expand_triton(y, h, layer.lora_b, slots, layer.slices, blocked=blocked)
    kind = "_blocked_kernel" if blocked else "_kernel"
    assert counts == {f"lora_shrink{kind}": 1, f"lora_expand{kind}": 1}


def test_shrink_writes_zeros_for_tokens_without_an_adapter(monkeypatch):
    """``h`` is allocated uninitialised; the per-token kernel writes the zeros itself."""
    empty = torch.empty

    def poisoned(*args, **kwargs):
        return empty(*args, **kwargs).fill_(float("nan"))

    monkeypatch.setattr(torch, "empty", poisoned)
    gen = torch.Generator().manual_seed(4)
    x = torch.randn(6, 40, generator=gen).to(DEVICE)
    a = torch.randn(2, 24, 40, generator=gen).to(DEVICE)
    slots = torch.tensor([0, -1, 1, -1, -1, 0], dtype=torch.int32, device=DEVICE)
    for blocked in (False, True):
        h = lora_shrink_triton(x, a, slots, blocked=blocked)
        assert torch.equal(h[slots < 0].cpu(), torch.zeros(3, 24))
        torch.testing.assert_close(h.cpu(), lora_shrink_reference(x, a, slots).cpu())
