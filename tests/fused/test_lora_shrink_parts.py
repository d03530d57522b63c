"""The decode shrink split over K: each program writes its part of ``h`` (float32
``parts[P, T, R]``) and the expand adds the parts as it loads ``h``. Triton kernels
(interpreter on CPU) against the torch reference, with more than one part (forced, or
through the multiprocessor count), K off the block size, rank blocks past R, mixed slots
(-1 too) and uneven merged slices; a dropped or double-counted part fails these."""

from __future__ import annotations

import pytest
import torch
from engine_sdk.layers import _lora_kernels, lora, split_k
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


def _case(num_tokens, k, r, num_slots=3, dtype=torch.float32, seed=0):
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(num_tokens, k, generator=gen).to(dtype)
    a = torch.randn(num_slots, r, k, generator=gen).to(dtype)
    slots = torch.randint(-1, num_slots, (num_tokens,), generator=gen, dtype=torch.int32)
    slots[0], slots[-1] = 0, -1  # one adapter token and one base token at least
    return x.to(DEVICE), a.to(DEVICE), slots.to(DEVICE)


@pytest.fixture
def poisoned_empty(monkeypatch):
    """``torch.empty`` filled with NaN: the kernels must write every element of the parts."""
    empty = torch.empty

    def poisoned(*args, **kwargs):
        return empty(*args, **kwargs).fill_(float("nan"))

    monkeypatch.setattr(torch, "empty", poisoned)


def test_split_follows_the_shape(monkeypatch):
    monkeypatch.setattr(split_k, "num_multiprocessors", lambda device: 132)
    cpu = torch.device("cpu")
    # decode: one part per BLOCK_K step of K (down: 3072, qkv: 1024 over 3 rank blocks)
    assert lora._shrink_split(1, 3072, 16, cpu) == (24, 128, 128)
    assert lora._shrink_split(1, 1024, 48, cpu) == (8, 128, 128)
    # 8 tokens x 3 rank blocks: 6 parts wanted, 8 steps -> 4 parts of 2 steps
    assert lora._shrink_split(8, 1024, 48, cpu) == (4, 128, 256)
    # enough programs already: one part
    assert lora._shrink_split(64, 1024, 48, cpu)[0] == 1
    assert lora._shrink_split(127, 4096, 16, cpu)[0] == 2
    # K below one block: one part, a smaller block
    assert lora._shrink_split(1, 40, 16, cpu) == (1, 64, 64)
    for num_tokens in (1, 3, 17, 100):
        for k in (40, 300, 1000, 3072, 5000):
            for r in (8, 16, 48, 64):
                parts, block_k, k_per_part = lora._shrink_split(num_tokens, k, r, cpu)
                assert k_per_part % block_k == 0
                assert (parts - 1) * k_per_part < k <= parts * k_per_part  # none empty
                assert parts <= -(-k // block_k)


def test_blocked_split_follows_the_shape(monkeypatch):
    """The blocked shrink (decode batches from BLOCKED_MIN_TOKENS, prefill chunks) splits
    K when its token blocks are fewer than the multiprocessors, never into empty parts."""
    monkeypatch.setattr(split_k, "num_multiprocessors", lambda device: 132)
    cpu = torch.device("cpu")
    assert lora._blocked_split(256, 1024, cpu) == (8, 128)  # 16 blocks: 9 wanted, 16 steps
    assert lora._blocked_split(256, 3072, cpu) == (8, 384)  # 48 steps: 9 wanted, 8 of 6 steps
    assert lora._blocked_split(1024, 1024, cpu) == (3, 384)  # 64 blocks: 3 parts
    assert lora._blocked_split(8192, 1024, cpu) == (1, 1024)  # 512 blocks: one part
    # one block would want 132 parts: capped at the expand's fixed BLOCK_P (16 of 3 steps)
    assert lora._blocked_split(16, 3072, cpu) == (16, 192)
    for num_tokens in (16, 128, 200, 256, 1000, 4096):
        for k in (40, 300, 1024, 3072, 5000):
            parts, k_per_part = lora._blocked_split(num_tokens, k, cpu)
            assert k_per_part % 64 == 0
            assert (parts - 1) * k_per_part < k <= parts * k_per_part  # none empty
            assert parts <= lora.BLOCKED_MAX_PARTS


@pytest.mark.parametrize("blocked", [False, True], ids=["per-token", "blocked"])
@pytest.mark.parametrize("num_parts", [1, 2, 3, 9])
@pytest.mark.parametrize(("k", "r"), [(300, 48), (520, 24), (384, 16)])
def test_each_part_is_its_k_range_and_they_sum_to_h(num_parts, k, r, blocked, poisoned_empty):
    """Part ``p`` equals the product over its own K range, exactly one range per part,
    the ranges covering K once; slot -1 tokens get zeros in every part. The blocked
    kernel's token block (16) holds several slots and -1 here, and 18 tokens end in a
    partial block."""
    num_tokens = 18 if blocked else 5
    x, a, slots = _case(num_tokens, k, r, seed=k + r)
    parts = lora_shrink_triton(x, a, slots, blocked=blocked, parts=True, num_parts=num_parts)
    if blocked:
        want_parts, k_per_part = lora._blocked_split(num_tokens, k, x.device, num_parts)
        assert want_parts == min(num_parts, -(-k // 64))  # BLOCK_K 64
    else:
        want_parts, _, k_per_part = lora._shrink_split(num_tokens, k, r, x.device, num_parts)
        assert want_parts == min(num_parts, -(-k // 128))  # BLOCK_K 128
    assert parts.shape == (want_parts, num_tokens, r) and parts.dtype == torch.float32
    ref = lora_shrink_reference(x, a, slots).cpu()
    for p in range(parts.shape[0]):
        cols = slice(p * k_per_part, min((p + 1) * k_per_part, k))
        want = lora_shrink_reference(x[:, cols], a[:, :, cols], slots).cpu()
        torch.testing.assert_close(parts[p].cpu(), want, atol=1e-4, rtol=1e-4)
    torch.testing.assert_close(parts.sum(0).cpu(), ref, atol=1e-4, rtol=1e-4)
    assert (parts[:, slots < 0] == 0).all()


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize("num_parts", [None, 1, 4])
def test_public_shrink_returns_the_whole_h(num_parts, dtype, poisoned_empty):
    x, a, slots = _case(6, 300, 40, dtype=dtype, seed=3)
    h = lora_shrink_triton(x, a, slots, num_parts=num_parts)
    assert h.shape == (6, 40) and h.dtype == torch.float32
    tol = 1e-4 if dtype == torch.float32 else 2e-2
    ref = lora_shrink_reference(x, a, slots).cpu()
    torch.testing.assert_close(h.cpu(), ref, atol=tol, rtol=tol)
    assert (h[slots < 0] == 0).all()
    # the blocked kernel gives the same h (its parts summed), and parts=True a part axis
    blocked = lora_shrink_triton(x, a, slots, blocked=True, num_parts=num_parts)
    torch.testing.assert_close(blocked.cpu(), ref, atol=tol, rtol=tol)
    want_parts = lora._blocked_split(6, 300, x.device, num_parts)[0]
    if num_parts is None:  # about one program a multiprocessor: 5 on a GPU, fewer on a CPU
        assert 1 <= want_parts <= 5  # 5 steps of 64, no part empty
    else:
        assert want_parts == (1 if num_parts == 1 else 3)  # 5 steps of 64: 3 parts of 2
    got = lora_shrink_triton(x, a, slots, blocked=True, parts=True, num_parts=num_parts)
    assert got.shape == (want_parts, 6, 40)


@pytest.mark.parametrize("blocked", [False, True], ids=["per-token", "blocked"])
@pytest.mark.parametrize("sizes", [(64, 32, 32), (40, 24, 24), (72,)], ids=str)
def test_expand_adds_every_part_once(sizes, blocked):
    """Parts of very different sizes (scaled by 10**p): leaving one out or adding one
    twice moves the result far off the reference expand of their sum."""
    num_tokens, rank, num_parts = 7, 8, 3
    gen = torch.Generator().manual_seed(11)
    slices = LoRASlices(sizes, DEVICE)
    scale = torch.tensor([1.0, 10.0, 100.0]).view(num_parts, 1, 1)
    parts = (torch.randn(num_parts, num_tokens, len(sizes) * rank, generator=gen) * scale).to(
        DEVICE
    )
    b = torch.randn(2, sum(sizes), rank, generator=gen).to(DEVICE)
    slots = torch.tensor([0, -1, 1, 1, -1, 0, 1], dtype=torch.int32, device=DEVICE)
    y0 = torch.randn(num_tokens, sum(sizes), generator=gen).to(DEVICE)
    y_ref, y_tri = y0.clone(), y0.clone()
    lora_expand_reference(y_ref, parts.sum(0), b, slots, slices)
    lora_expand_triton(y_tri, parts, b, slots, slices, blocked=blocked)
    torch.testing.assert_close(y_tri.cpu(), y_ref.cpu(), atol=1e-3, rtol=1e-4)
    assert torch.equal(y_tri[slots < 0], y0[slots < 0])


def _layer(sizes, k, dtype, max_rank=16, seed=0):
    """Slots 0..2 with adapters of ranks 16, 8, 3 (slot 1 leaves slice 1 alone)."""
    gen = torch.Generator().manual_seed(seed)
    layer = LoRALayer(LoRAContext(64, DEVICE), 3, max_rank, k, sizes, dtype, DEVICE)
    adapters = {}
    for slot, rank in enumerate((16, 8, 3)):
        pairs = [
            (torch.randn(rank, k, generator=gen) * 0.1, torch.randn(n, rank, generator=gen) * 0.1)
            for n in sizes
        ]
        if slot == 1 and len(sizes) > 1:
            pairs[1] = None  # type: ignore[call-overload]
        adapters[slot] = [None if p is None else (p[0].to(dtype), p[1].to(dtype)) for p in pairs]
        layer.set_slot(slot, adapters[slot])
    return layer, adapters


@pytest.mark.parametrize("blocked", [False, True], ids=["per-token", "blocked"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize("sizes", [(64, 32, 32), (40, 24, 24), (48, 48), (72,)], ids=str)
def test_layer_apply_with_many_parts(monkeypatch, sizes, dtype, blocked):
    """``LoRALayer.apply`` on the kernels with the multiprocessor count raised so the
    shrink splits K (300: two full blocks and a partial one of 128 for the per-token
    kernel, five steps of 64 for the blocked one) into 3 and 5 parts: two launches, the
    expand taking the parts, the result the per-token, per-slice definition. ``blocked``:
    the threshold lowered so these six tokens (one block, three slots and -1) take the
    blocked kernels."""
    monkeypatch.setattr(split_k, "num_multiprocessors", lambda device: 64)
    monkeypatch.setattr(lora, "_forced", lambda: True)
    if blocked:
        monkeypatch.setattr(lora, "BLOCKED_MIN_TOKENS", 1)
    launches: list[tuple[str, tuple]] = []

    class Counting:
        def __init__(self, name, kernel):
            self.name, self.kernel = name, kernel

        def __getitem__(self, grid):
            launches.append((self.name, grid))
            return self.kernel[grid]

    names = ["lora_shrink_kernel", "lora_expand_kernel"]
    if blocked:
        names = ["lora_shrink_blocked_kernel", "lora_expand_blocked_kernel"]
    for name in names:
        monkeypatch.setattr(_lora_kernels, name, Counting(name, getattr(_lora_kernels, name)))
    k, num_tokens = 300, 6
    layer, adapters = _layer(sizes, k, dtype)
    gen = torch.Generator().manual_seed(5)
    x = torch.randn(num_tokens, k, generator=gen).to(dtype).to(DEVICE)
    y0 = torch.randn(num_tokens, sum(sizes), generator=gen).to(dtype).to(DEVICE)
    slots = torch.tensor([0, -1, 2, 1, 0, -1], dtype=torch.int32)
    layer.context.token_slots[:num_tokens] = slots.to(DEVICE)
    layer.context.active = True
    y = layer.apply(x, y0.clone())
    assert [name for name, _ in launches] == names
    # per token: rank blocks of 16 x 3 parts; blocked: one block of 16 tokens x 5 parts
    assert launches[0][1] == ((1, 5) if blocked else (num_tokens, len(sizes), 3))
    want = y0.float().cpu().clone()
    for t, s in enumerate(slots.tolist()):
        if s < 0:
            continue
        offset = 0
        for n, pair in zip(sizes, adapters[s], strict=True):
            if pair is not None:
                a, b = (w.float() for w in pair)
                want[t, offset : offset + n] += b @ (a @ x[t].float().cpu())
            offset += n
    tol = 1e-4 if dtype == torch.float32 else 3e-2
    torch.testing.assert_close(y.float().cpu(), want, atol=tol, rtol=tol)
    assert torch.equal(y[slots < 0].cpu(), y0[slots < 0].cpu())
