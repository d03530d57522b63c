"""engine_sdk.layers.split_k: how K is split, the second pass that adds the parts, and the
one-launch addition by the last part of a tile (Triton's interpreter on a CPU)."""

from __future__ import annotations

import pytest
import torch
import triton
import triton.language as tl
from engine_sdk.layers.split_k import (
    pick_split,
    plan_split_k,
    reduce_split_k,
    split_k_locks,
    store_split_k,
)

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


@pytest.mark.parametrize(
    ("num_tiles", "num_steps", "target", "expected"),
    [
        (224, 32, 528, (3, 11)),  # 8B gate/up, one token: 3 parts of 11, 11, 10 steps
        (32, 112, 528, (16, 7)),  # 8B down: 17 wanted, 7 steps each makes 16 parts
        (1000, 32, 528, (1, 32)),  # enough tiles: no split
        (1, 5, 528, (5, 1)),  # never more parts than steps
        (8, 7, 16, (2, 4)),  # the last part is shorter, never empty
    ],
)
def test_pick_split(num_tiles: int, num_steps: int, target: int, expected: tuple[int, int]) -> None:
    split, per_split = pick_split(num_tiles, num_steps, target)
    assert (split, per_split) == expected
    assert (split - 1) * per_split < num_steps <= split * per_split


@pytest.mark.parametrize("bias", [False, True])
def test_reduce_adds_parts_bias_and_casts(bias: bool) -> None:
    gen = torch.Generator().manual_seed(0)
    partials = torch.randn(3, 5, 40, generator=gen).to(DEVICE)
    b = torch.randn(40, generator=gen).to(DEVICE, torch.float16) if bias else None
    out = reduce_split_k(partials, b, torch.float16)
    want = partials.double().sum(0) + (b.double() if b is not None else 0)
    assert out.dtype == torch.float16 and out.shape == (5, 40)
    torch.testing.assert_close(out.double(), want.to(out.device), rtol=1e-3, atol=1e-3)


def test_plan_split_k(monkeypatch) -> None:
    import engine_sdk.layers.split_k as split_k

    # 4 multiprocessors (a CPU's stand-in; on a GPU the real count would change the plan):
    # 2 per SM over 2 tiles wants 4 parts of 10 steps.
    monkeypatch.setattr(split_k, "num_multiprocessors", lambda device: 4)
    x = torch.zeros(3, 64, dtype=torch.float16, device=DEVICE)
    plan = plan_split_k(x, 40, 2, 10, 2)
    assert (plan.split, plan.steps_per_split) == (4, 3)
    assert plan.out.shape == (3, 40) and plan.out.dtype == torch.float16
    assert plan.parts.shape == (4, 3, 40) and plan.parts.dtype == torch.float32
    assert plan.locks.shape == (2,) and not plan.locks.any()
    locks = split_k_locks(2, DEVICE)
    assert plan_split_k(x, 40, 2, 10, 2, split=5, locks=locks).locks is locks
    one = plan_split_k(x, 40, 2, 10, 2, split=1)
    assert one.split == 1 and one.parts is one.out and one.locks is one.out
    with pytest.raises(AssertionError, match="too few split-K locks"):
        plan_split_k(x, 40, 3, 10, 2, locks=locks)


@triton.jit  # type: ignore[untyped-decorator]
def _parts_kernel(out_ptr, part_ptr, lock_ptr, bias_ptr, N, num_splits,  # type: ignore[no-untyped-def]
                  HAS_BIAS: tl.constexpr, SPLIT: tl.constexpr, BLOCK: tl.constexpr):  # fmt: skip
    """Part ``s`` of column ``n`` is ``(s + 1) * (n + 1)``: the sum over S parts is
    ``(n + 1) * S (S + 1) / 2``, exact in float32, and misses any part that is dropped."""
    pid_n = tl.program_id(0)
    pid_s = tl.program_id(1)
    cols = pid_n * BLOCK + tl.arange(0, BLOCK)
    mask = (cols < N)[None, :]
    acc = ((pid_s + 1) * (cols + 1)).to(tl.float32)[None, :]
    store_split_k(
        acc, out_ptr + cols[None, :], mask, bias_ptr + cols[None, :], part_ptr + cols[None, :],
        N, lock_ptr + pid_n, pid_s, num_splits, HAS_BIAS, SPLIT,
    )  # fmt: skip


@pytest.mark.parametrize("num_splits", [1, 2, 5])
@pytest.mark.parametrize("bias", [False, True])
def test_store_adds_every_part_once_and_resets_the_counters(num_splits: int, bias: bool) -> None:
    num_cols, block = 40, 16  # 3 column tiles, the last one partial
    locks = split_k_locks(3, DEVICE)
    b = torch.arange(num_cols, dtype=torch.float16, device=DEVICE) if bias else None
    want = torch.arange(1, num_cols + 1, dtype=torch.float32) * num_splits * (num_splits + 1) / 2
    if b is not None:
        want += b.float().cpu()
    for _ in range(2):  # the second call finds the counters at zero again (graph replays)
        out = torch.full((1, num_cols), -1.0, dtype=torch.float16, device=DEVICE)
        parts = torch.empty(num_splits, 1, num_cols, dtype=torch.float32, device=DEVICE)
        _parts_kernel[(3, num_splits)](
            out, parts, locks, b if b is not None else out, num_cols, num_splits,
            HAS_BIAS=b is not None, SPLIT=num_splits > 1, BLOCK=block,
        )  # fmt: skip
        assert torch.equal(out.float().cpu()[0], want)
        assert not locks.any()
