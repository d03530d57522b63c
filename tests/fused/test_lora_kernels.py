"""Batched LoRA shrink/expand: Triton kernels (interpreter on CPU) against the torch
reference, and the reference against a per-token loop."""

from __future__ import annotations

import pytest
import torch
from engine_sdk.layers.lora import (
    LoRAContext,
    LoRALayer,
    lora_expand_reference,
    lora_expand_triton,
    lora_shrink_reference,
    lora_shrink_triton,
)

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


def _case(num_tokens: int, k: int, r: int, num_slots: int, seed: int = 0):
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(num_tokens, k, generator=gen)
    a = torch.randn(num_slots, r, k, generator=gen)
    slots = torch.randint(-1, num_slots, (num_tokens,), generator=gen, dtype=torch.int32)
    return x.to(DEVICE), a.to(DEVICE), slots.to(DEVICE)


def _loop_shrink(x, a, slots):
    out = torch.zeros(x.shape[0], a.shape[1])
    for t, s in enumerate(slots.tolist()):
        if s >= 0:
            out[t] = x[t].cpu() @ a[s].cpu().T
    return out


@pytest.mark.parametrize("blocked", [False, True], ids=["per-token", "blocked"])
@pytest.mark.parametrize(
    ("num_tokens", "k", "r", "num_slots"),
    # the last two: the per-token shrink splits K (1000, 520) into parts
    [(1, 64, 8, 1), (7, 100, 16, 3), (37, 40, 48, 2), (1, 1000, 48, 4), (2, 700, 16, 3)],
)
def test_shrink_triton_matches_reference(num_tokens, k, r, num_slots, blocked):
    x, a, slots = _case(num_tokens, k, r, num_slots)
    if num_tokens > 16:  # a run of one slot, as a prefill chunk gives: a uniform block
        slots[:16] = 1
    ref = lora_shrink_reference(x, a, slots)
    torch.testing.assert_close(ref.cpu(), _loop_shrink(x, a, slots), atol=1e-4, rtol=1e-4)
    got = lora_shrink_triton(x, a, slots, blocked=blocked)
    torch.testing.assert_close(got.cpu(), ref.cpu(), atol=1e-4, rtol=1e-4)
    # a no-adapter token gets exactly zero
    assert (got[slots < 0] == 0).all()


@pytest.mark.parametrize("blocked", [False, True], ids=["per-token", "blocked"])
@pytest.mark.parametrize(("num_tokens", "n", "r", "num_slots"), [(1, 64, 8, 1), (21, 200, 16, 4)])
def test_expand_triton_matches_reference_on_a_column_slice(num_tokens, n, r, num_slots, blocked):
    gen = torch.Generator().manual_seed(1)
    h = torch.randn(num_tokens, 2 * r, generator=gen).to(DEVICE)
    b = torch.randn(num_slots, n + 8, r, generator=gen).to(DEVICE)
    slots = torch.randint(-1, num_slots, (num_tokens,), generator=gen, dtype=torch.int32).to(DEVICE)
    base = torch.randn(num_tokens, n + 8 + 5, generator=gen).to(DEVICE)
    # the second slice: columns 8 .. 8+n of y, rows 8.. of B, the second rank block of h
    y_ref, y_tri = base.clone(), base.clone()
    lora_expand_reference(y_ref[:, 8 : 8 + n], h[:, r:], b[:, 8:], slots)
    lora_expand_triton(y_tri[:, 8 : 8 + n], h[:, r:], b[:, 8:], slots, blocked=blocked)
    torch.testing.assert_close(y_tri.cpu(), y_ref.cpu(), atol=1e-4, rtol=1e-4)
    untouched = torch.ones_like(base, dtype=torch.bool)
    untouched[:, 8 : 8 + n] = False
    untouched[slots >= 0, 8 : 8 + n] = False
    untouched[slots < 0, :] = True
    assert torch.equal(y_tri[untouched], base[untouched])
    want = base.clone()
    for t, s in enumerate(slots.tolist()):
        if s >= 0:
            want[t, 8 : 8 + n] += h[t, r:] @ b[s, 8:].T
    torch.testing.assert_close(y_ref.cpu(), want.cpu(), atol=1e-4, rtol=1e-4)


def test_layer_with_merged_slices_matches_per_projection_lora():
    """A q/k/v-style layer (3 slices, one adapter per slot) equals three separate LoRAs."""
    gen = torch.Generator().manual_seed(2)
    k, sizes, rank, max_rank = 32, [16, 8, 8], 4, 8
    ctx = LoRAContext(16, DEVICE)
    layer = LoRALayer(ctx, 2, max_rank, k, sizes, torch.float32, DEVICE)
    pairs = {
        slot: [
            (torch.randn(rank, k, generator=gen), torch.randn(n, rank, generator=gen))
            for n in sizes
        ]
        for slot in range(2)
    }
    pairs[1][1] = None  # type: ignore[call-overload]  # slot 1 leaves k alone
    for slot, p in pairs.items():
        layer.set_slot(slot, [None if q is None else (q[0].to(DEVICE), q[1].to(DEVICE)) for q in p])
    x = torch.randn(5, k, generator=gen).to(DEVICE)
    slots = torch.tensor([0, -1, 1, 1, 0], dtype=torch.int32)
    ctx.token_slots[:5] = slots.to(DEVICE)
    ctx.active = True
    y = layer.apply(x, torch.zeros(5, sum(sizes), device=DEVICE))
    want = torch.zeros(5, sum(sizes))
    for t, s in enumerate(slots.tolist()):
        if s < 0:
            continue
        offset = 0
        for n, pair in zip(sizes, pairs[s], strict=True):
            if pair is not None:
                want[t, offset : offset + n] = pair[1] @ (pair[0] @ x[t].cpu())
            offset += n
    torch.testing.assert_close(y.cpu(), want, atol=1e-4, rtol=1e-4)
    ctx.active = False
    assert torch.equal(
        layer.apply(x, torch.zeros(5, sum(sizes), device=DEVICE)).cpu(), torch.zeros(5, 32)
    )
