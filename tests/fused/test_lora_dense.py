"""The many-token LoRA path (``lora_dense``: cuBLAS over every slot, masked) against the
torch reference: merged slices, padded ranks, slot -1 tokens, slots rewritten and cleared
(``lora_bt`` kept in step with ``lora_b``), the one-hot table, and ``LoRALayer.apply``
choosing it."""

from __future__ import annotations

import pytest
import torch
from engine_sdk.layers import lora, lora_dense
from engine_sdk.layers.lora import (
    LoRAContext,
    LoRALayer,
    lora_expand_reference,
    lora_shrink_reference,
)
from engine_sdk.layers.lora_dense import block_bt, lora_apply_dense, slot_onehot

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


def _layer(sizes, num_slots, max_rank, k, dtype, seed):
    gen = torch.Generator().manual_seed(seed)
    ctx = LoRAContext(64, DEVICE)
    layer = LoRALayer(ctx, num_slots, max_rank, k, sizes, dtype, DEVICE)
    for slot in range(num_slots):
        rank = max_rank - slot  # padded ranks below max_rank
        pairs = [
            (torch.randn(rank, k, generator=gen), torch.randn(n, rank, generator=gen) * 0.5)
            for n in sizes
        ]
        if slot == 1 and len(sizes) > 1:
            pairs[1] = None  # type: ignore[call-overload]  # this adapter leaves slice 1 alone
        layer.set_slot(
            slot,
            [
                None if p is None else (p[0].to(DEVICE, dtype), p[1].to(DEVICE, dtype))
                for p in pairs
            ],
        )
    return layer, gen


def _reference(layer, x, y, slots):
    want = y.clone()
    h = lora_shrink_reference(x, layer.lora_a, slots)
    lora_expand_reference(want, h, layer.lora_b, slots, layer.slices)
    return want


EXPANDS = ["torch", "triton"]  # the Triton expand runs in the interpreter on a CPU


@pytest.mark.parametrize("expand", EXPANDS)
@pytest.mark.parametrize(
    ("sizes", "num_slots", "max_rank", "k", "num_tokens"),
    [([24], 1, 8, 40, 9), ([16, 8, 8], 3, 8, 32, 37), ([12, 12], 4, 16, 48, 20)],
    ids=["one-slice", "qkv", "gate-up"],
)
def test_dense_matches_reference(sizes, num_slots, max_rank, k, num_tokens, expand) -> None:
    layer, gen = _layer(sizes, num_slots, max_rank, k, torch.float32, seed=num_tokens)
    x = torch.randn(num_tokens, k, generator=gen).to(DEVICE)
    y = torch.randn(num_tokens, sum(sizes), generator=gen).to(DEVICE)
    slots = torch.randint(-1, num_slots, (num_tokens,), generator=gen, dtype=torch.int32)
    slots[0] = -1  # at least one base token: its row must stay as it was
    slots = slots.to(DEVICE)
    want = _reference(layer, x, y, slots)
    got = y.clone()
    lora_apply_dense(x, got, layer.lora_a, layer.lora_bt, slots, layer.slot_onehot, expand)
    torch.testing.assert_close(got, want, atol=1e-4, rtol=1e-4)
    assert torch.equal(got[0], y[0])
    assert not torch.allclose(got, y)  # the adapters changed something: the test can fail


@pytest.mark.parametrize("expand", EXPANDS)
def test_dense_in_bfloat16_is_as_close_as_the_reference_rounding(expand) -> None:
    sizes = [64, 32, 32]
    layer, gen = _layer(sizes, 4, 16, 128, torch.bfloat16, seed=5)
    x = torch.randn(50, 128, generator=gen).to(DEVICE, torch.bfloat16)
    y = torch.randn(50, sum(sizes), generator=gen).to(DEVICE, torch.bfloat16)
    slots = (torch.arange(50, dtype=torch.int32) % 5 - 1).to(DEVICE)
    want = _reference(layer, x, y, slots)
    got = y.clone()
    lora_apply_dense(x, got, layer.lora_a, layer.lora_bt, slots, layer.slot_onehot, expand)
    # h rounds to bfloat16 before the expand (as the blocked kernels do): a few ulps
    torch.testing.assert_close(got.float(), want.float(), atol=0.25, rtol=0.02)


def test_rewritten_and_cleared_slots_stay_in_step() -> None:
    """``lora_bt`` follows ``set_slot`` and ``clear_slot``: the dense path sees the new B."""
    sizes = [8, 8]
    layer, gen = _layer(sizes, 2, 4, 16, torch.float32, seed=1)
    layer.set_slot(0, [(torch.randn(4, 16).to(DEVICE), torch.randn(8, 4).to(DEVICE))] * 2)
    layer.clear_slot(1)
    torch.testing.assert_close(layer.lora_bt, block_bt(layer.lora_b, sizes))
    torch.testing.assert_close(layer.lora_bt[0, :4, :8], layer.lora_b[0, :8].T)
    torch.testing.assert_close(layer.lora_bt[0, 4:, 8:], layer.lora_b[0, 8:].T)
    assert torch.count_nonzero(layer.lora_bt[0, :4, 8:]) == 0  # off the diagonal blocks
    assert torch.count_nonzero(layer.lora_bt[1]) == 0
    x = torch.randn(6, 16, generator=gen).to(DEVICE)
    y = torch.zeros(6, 16, device=DEVICE)
    slots = torch.tensor([0, 1, 0, 1, -1, 0], dtype=torch.int32, device=DEVICE)
    got = y.clone()
    lora_apply_dense(x, got, layer.lora_a, layer.lora_bt, slots, layer.slot_onehot)
    torch.testing.assert_close(got, _reference(layer, x, y, slots), atol=1e-4, rtol=1e-4)
    assert torch.count_nonzero(got[1]) == 0 and torch.count_nonzero(got[0]) > 0


def test_slot_onehot_gives_slot_minus_one_a_zero_row() -> None:
    table = slot_onehot(3, torch.bfloat16, DEVICE)
    slots = torch.tensor([2, -1, 0, 1, -1], dtype=torch.int32, device=DEVICE)
    want = torch.tensor(
        [[0, 0, 1], [0, 0, 0], [1, 0, 0], [0, 1, 0], [0, 0, 0]], dtype=torch.bfloat16
    )
    assert torch.equal(table[slots].cpu(), want)


def test_apply_takes_the_dense_path_from_the_threshold(monkeypatch: pytest.MonkeyPatch) -> None:
    sizes = [16, 8, 8]
    layer, gen = _layer(sizes, 3, 8, 32, torch.float32, seed=7)
    calls: list[int] = []

    def counted(x, *args):
        calls.append(x.shape[0])
        lora_apply_dense(x, *args)

    monkeypatch.setattr(lora, "lora_apply_dense", counted)
    monkeypatch.setattr(lora_dense, "DENSE_ON_CPU", True)
    monkeypatch.setattr(lora_dense, "DENSE_MIN_TOKENS", 10)
    slots = (torch.arange(12, dtype=torch.int32) % 4 - 1).to(DEVICE)
    layer.context.token_slots[:12] = slots
    layer.context.active = True
    for num_tokens in (9, 12):  # below, then at the threshold
        x = torch.randn(num_tokens, 32, generator=gen).to(DEVICE)
        y = torch.randn(num_tokens, 32, generator=gen).to(DEVICE)
        want = _reference(layer, x, y, slots[:num_tokens])
        torch.testing.assert_close(layer.apply(x, y.clone()), want, atol=1e-4, rtol=1e-4)
    assert calls == [12]


def test_cuda_threshold_is_the_same_in_and_out_of_a_graph(monkeypatch: pytest.MonkeyPatch) -> None:
    """On CUDA: from ``DENSE_MIN_TOKENS`` whether or not a graph is being captured (a
    stand-in tensor: only ``is_cuda`` and ``shape`` are read)."""
    from types import SimpleNamespace

    capturing = [False]
    monkeypatch.setattr(torch.cuda, "is_current_stream_capturing", lambda: capturing[0])
    monkeypatch.setattr(lora_dense, "DENSE_MIN_TOKENS", 128)

    def dense(num_tokens: int) -> bool:
        return lora_dense.use_dense(SimpleNamespace(is_cuda=True, shape=(num_tokens, 64)))

    assert [dense(n) for n in (127, 128, 511, 512)] == [False, True, True, True]
    capturing[0] = True
    assert [dense(n) for n in (127, 128, 511, 512)] == [False, True, True, True]
    cpu = torch.zeros(600, 4)
    assert not lora_dense.use_dense(cpu)  # the CPU only where a test asks for it


def test_slot_bytes_formula_matches_the_layers_tensors() -> None:
    """``LoRAConfig.slot_bytes`` (docs/lora.md's memory formula) is what the layers hold."""
    from engine.lora.config import LoRAConfig

    shapes = [(32, [16, 8, 8]), (16, [32]), (32, [24, 24])]  # (in, slices): qkv, o, gate/up
    held = 0
    for k, sizes in shapes:
        layer = LoRALayer(LoRAContext(8, "cpu"), 3, 4, k, sizes, torch.bfloat16, "cpu")
        held += layer.lora_a.nbytes + layer.lora_b.nbytes + layer.lora_bt.nbytes
    projections = [(k, sum(sizes), len(sizes)) for k, sizes in shapes]
    assert LoRAConfig.slot_bytes(3, 4, projections, 2) == held


def test_every_step_size_uses_a_kernel_the_warm_up_compiled(monkeypatch) -> None:
    """The Triton expand's compiled variants are its tile shapes only (the token count and
    a projection's rows per slot are not specialized on), and ``warm_up_dense`` launches
    each of them: no step compiles a kernel after startup. Launches are recorded, not run."""
    from engine_sdk.layers import _lora_dense_kernel

    kernel = _lora_dense_kernel.lora_dense_expand_kernel
    free = getattr(kernel, "do_not_specialize", None)
    if free is None:  # the interpreter keeps the decorator's arguments
        free = kernel.kwargs.get("do_not_specialize")
    assert {"T", "ROWS_PER_SLOT"} <= set(free)
    seen: list[tuple] = []

    class Recording:
        def __getitem__(self, grid):
            def launch(*args, **constexprs):
                ints = {
                    n: v for n, v in zip(kernel.arg_names, args, strict=False) if type(v) is int
                }
                classes = tuple(
                    sorted((n, v == 1, v % 16 == 0) for n, v in ints.items() if n not in free)
                )
                seen.append((tuple(sorted(constexprs.items())), classes))

            return launch

    monkeypatch.setattr(lora_dense, "_kernel", lambda: Recording())
    monkeypatch.setattr(lora_dense, "EXPAND", "triton")
    assert lora_dense.warm_up_dense(torch.bfloat16, "cpu") == 3
    warmed = set(seen)
    assert len(warmed) == 3
    seen.clear()
    for sizes, k in (([2048, 1024, 1024], 1024), ([1024], 2048), ([3072, 3072], 1024)):
        layer = LoRALayer(LoRAContext(8, "cpu"), 4, 16, k, sizes, torch.bfloat16, "cpu")
        for num_tokens in (16, 100, 256, 257, 1000, 2048, 2049, 7911):
            x = torch.zeros(num_tokens, k, dtype=torch.bfloat16)
            y = torch.zeros(num_tokens, sum(sizes), dtype=torch.bfloat16)
            slots = torch.zeros(num_tokens, dtype=torch.int32)
            args = (layer.lora_a, layer.lora_bt, slots, layer.slot_onehot, "triton")
            lora_apply_dense(x, y, *args)
    assert set(seen) <= warmed, set(seen) - warmed
