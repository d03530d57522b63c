"""LoRA for many tokens at once (prefill chunks, large decode batches) through cuBLAS.

Every slot's shrink in one GEMM, a mask that keeps each token's own slot, then one GEMM
that adds ``h @ Bt`` into the projection's output (``addmm_``, beta 1)::

    h    = x @ [A_0; A_1; ...; A_{S-1}].T        [T, S * slices * R]   (one GEMM)
    h   *= onehot[slot_t]                        [T, S, slices * R]    (a row lookup and
                                                                        a product in place)
    y   += h @ Bt                                [T, S*slices*R] @ [S*slices*R, N]
                                                                       (one GEMM, all slices)

``Bt`` (``LoRALayer.lora_bt``, ``[S, slices * R, N]``) is ``lora_b`` transposed per slot
and laid out block-diagonally over the slices: the R rows of slice ``i`` hold ``B_i.T`` in
slice ``i``'s columns and zeros elsewhere, so one GEMM covers a merged projection (q/k/v,
gate/up) and its rows are in ``h``'s order (``lora_a``'s ``[S, slices, R]``); no reorder.
``onehot`` (``slot_onehot``) is ``[S + 1, S]`` in the model's dtype with an all-zero last
row, so slot -1 (no adapter) indexes it and gets a zero row: ``y`` stays as it was.

The products cover every slot for every token (S times the work of the token's own slot,
``slices`` times more for the expand's zero blocks), which at rank 16 and a few slots is
a small share of the base projection; what it buys is cuBLAS's bandwidth on the output's
read-modify-write, the cost that dominates once a step holds thousands of tokens (round
12 on an H100: the blocked Triton kernels added 32 ms to a 22 ms prefill step of 7,911
tokens over 4 adapters), and four launches a projection whatever its slices (round 12's
form, a mask built per call and one GEMM per slice, took 5 to 7: about twenty a decoder
layer, the decode step at batch 256 costing 2.3 ms more than the base's).

The roundings are the blocked kernels': ``h`` leaves the shrink in the model's dtype
(the float32 sum rounded once, as the expand kernels round it before their dot), the
expand sums in float32 and rounds once into ``y``.

No host sync, so CUDA graphs capture it too. On CUDA the expand is one Triton launch
that masks ``h`` as it loads (``_lora_dense_kernel``; ``EXPAND``), so a projection is two
launches (cuBLAS's shrink, this expand); elsewhere, or with
``ENGINE_LORA_DENSE_EXPAND=torch``, the one-hot lookup, its product into ``h`` and
``addmm_``. Round 13 on an H100 (W1 over 4 adapters + base, one call; kernel table of
q/k/v over 4 adapters, eager): the Triton expand took the mixed W1 from 76% of base to
86% (decode steps at batch 256: 9.27 ms against 10.31 with the torch expand, base 8.24;
prefill steps of 7,911 tokens 30.3 against 34.5, base 22.4), and it is faster than the
blocked Triton kernels from 16 tokens (13.0 us against 26.7; 256 tokens 14.7 against
33-87 in two calls; 4,096 tokens 49.5 against 240), so steps take it from
``DENSE_MIN_TOKENS`` (16, ``ENGINE_LORA_DENSE_MIN_TOKENS``) tokens, in CUDA graphs and
outside them alike (round 12's form, with more torch calls, started later outside a
graph, where each call costs host time). On the CPU only where a test sets
``DENSE_ON_CPU``.
"""

from __future__ import annotations

import functools
import os
from collections.abc import Sequence

import torch

DENSE_MIN_TOKENS = int(os.environ.get("ENGINE_LORA_DENSE_MIN_TOKENS", "16"))
DENSE_ON_CPU = False
# The expand: "triton" (one launch that masks as it loads, ``_lora_dense_kernel``; CUDA
# only unless a caller asks) or "torch" (the one-hot lookup, its product into ``h`` and
# cuBLAS's ``addmm_``: three launches). ENGINE_LORA_DENSE_EXPAND for comparisons.
EXPAND = os.environ.get("ENGINE_LORA_DENSE_EXPAND", "triton")


def use_dense(x: torch.Tensor) -> bool:
    """Whether ``x`` [T, K] takes the dense path: ``DENSE_MIN_TOKENS`` tokens or more, on
    a CUDA device (on the CPU where a test sets ``DENSE_ON_CPU``)."""
    return x.shape[0] >= DENSE_MIN_TOKENS and (x.is_cuda or DENSE_ON_CPU)


def slot_onehot(num_slots: int, dtype: torch.dtype, device: torch.device | str) -> torch.Tensor:
    """``[S + 1, S]``: row ``s`` one-hot at ``s``, the last row (index -1) all zeros."""
    table = torch.zeros(num_slots + 1, num_slots, dtype=dtype, device=device)
    table[:num_slots].fill_diagonal_(1)
    return table


def block_bt(lora_b: torch.Tensor, sizes: Sequence[int]) -> torch.Tensor:
    """``lora_b`` [S, N, R] as the dense expand reads it: ``[S, slices * R, N]``, slice
    ``i``'s rows ``B_i.T`` in its own columns, zeros elsewhere."""
    num_slots, num_out, rank = lora_b.shape
    bt = lora_b.new_zeros(num_slots, len(sizes) * rank, num_out)
    for slot in range(num_slots):
        fill_block_bt(bt[slot], lora_b[slot], sizes)
    return bt


def fill_block_bt(bt: torch.Tensor, b: torch.Tensor, sizes: Sequence[int]) -> None:
    """One slot of :func:`block_bt`: ``bt`` [slices * R, N] from ``b`` [N, R], in place."""
    rank = b.shape[1]
    bt.zero_()
    offset = 0
    for i, size in enumerate(sizes):
        cols = slice(offset, offset + size)
        bt[i * rank : (i + 1) * rank, cols].copy_(b[cols].T)
        offset += size


@functools.lru_cache(maxsize=1)
def _kernel() -> object | None:
    try:
        from engine_sdk.layers._lora_dense_kernel import lora_dense_expand_kernel
    except ImportError:
        return None
    kernel: object = lora_dense_expand_kernel
    return kernel


def default_expand(x: torch.Tensor) -> str:
    """The expand ``lora_apply_dense`` runs for ``x``: ``EXPAND`` on CUDA where Triton
    imports, else "torch"."""
    return "triton" if EXPAND == "triton" and x.is_cuda and _kernel() is not None else "torch"


def lora_apply_dense(
    x: torch.Tensor,
    y: torch.Tensor,
    lora_a: torch.Tensor,
    lora_bt: torch.Tensor,
    slots: torch.Tensor,
    onehot: torch.Tensor,
    expand: str | None = None,
) -> None:
    """``y[t] += B[slots[t]] @ A[slots[t]] @ x[t]`` in place for every token (nothing where
    ``slots[t] < 0``); ``x`` [T, K], ``y`` [T, N] with unit column stride, ``lora_a``
    [S, slices * R, K], ``lora_bt`` [S, slices * R, N] (:func:`block_bt`), ``onehot``
    :func:`slot_onehot` in ``x``'s dtype; ``expand`` "triton" or "torch" (None:
    :func:`default_expand`)."""
    num_tokens, k = x.shape
    num_slots, slice_rows, _ = lora_a.shape
    assert lora_bt.shape == (num_slots, slice_rows, y.shape[1]) and y.stride(1) == 1
    assert onehot.shape == (num_slots + 1, num_slots) and onehot.dtype == x.dtype
    if num_tokens == 0:
        return
    h = torch.mm(x, lora_a.view(num_slots * slice_rows, k).t())
    bt = lora_bt.view(num_slots * slice_rows, -1)
    if (expand or default_expand(x)) == "triton":
        _expand_triton(y, h, bt, slots[:num_tokens], slice_rows)
        return
    h.view(num_tokens, num_slots, slice_rows).mul_(onehot[slots[:num_tokens]][:, :, None])
    y.addmm_(h, bt)


DENSE_BLOCK_K = 64  # the expand's K step: fixed (one variant per tile shape), as measured


def dense_tiles(num_tokens: int) -> tuple[int, int, int]:
    """``(BLOCK_M, BLOCK_N, num_warps)`` of the Triton expand for a step of ``num_tokens``:
    more programs for decode batches, larger tiles for prefill chunks. Three shapes, each
    one compiled kernel (:func:`warm_up_dense` compiles them at startup)."""
    if num_tokens <= 256:
        return 32, 64, 4
    if num_tokens <= 2048:
        return 64, 64, 4
    return 128, 128, 8


def warm_up_dense(dtype: torch.dtype, device: torch.device | str) -> int:
    """Compile the Triton expand's variants for ``dtype`` now (one launch of each tile
    shape on a few scratch rows): the first prefill chunk with an adapter, often a
    request's first step, then waits for no compile. Returns the launches made (0
    without Triton)."""
    if EXPAND != "triton" or _kernel() is None:
        return 0
    counts = (16, 257, 2049)  # one step size for each of dense_tiles' shapes
    for num_tokens in counts:
        h = torch.zeros(num_tokens, 64, dtype=dtype, device=device)
        bt = torch.zeros(64, 64, dtype=dtype, device=device)
        y = torch.zeros(num_tokens, 64, dtype=dtype, device=device)
        slots = torch.full((num_tokens,), -1, dtype=torch.int32, device=device)
        _expand_triton(y, h, bt, slots, 16)
    return len(counts)


def _expand_triton(
    y: torch.Tensor, h: torch.Tensor, bt: torch.Tensor, slots: torch.Tensor, rows_per_slot: int
) -> None:
    """One launch of ``_lora_dense_kernel`` with :func:`dense_tiles`' tile."""
    kernel = _kernel()
    assert kernel is not None, "the dense expand needs Triton"
    num_tokens, num_out = y.shape
    assert h.stride(1) == bt.stride(1) == 1
    block_m, block_n, num_warps = dense_tiles(num_tokens)
    grid = (-(-num_tokens // block_m), -(-num_out // block_n))
    kernel[grid](  # type: ignore[index]
        h, bt, y, slots, num_tokens, num_out, h.shape[1], h.stride(0), bt.stride(0),
        y.stride(0), rows_per_slot, BLOCK_M=block_m, BLOCK_N=block_n, BLOCK_K=DENSE_BLOCK_K,
        DOT_PRECISION="ieee" if h.dtype == torch.float32 else "tf32", num_warps=num_warps,
    )  # fmt: skip
