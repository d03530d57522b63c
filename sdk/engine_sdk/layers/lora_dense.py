"""LoRA for many tokens at once (prefill chunks, large decode batches) through cuBLAS.

Every slot's shrink in one GEMM, a mask that keeps each token's own slot, then one GEMM
per slice that adds ``h @ B`` into the projection's output (``addmm_``, beta 1)::

    h    = x @ [A_0; A_1; ...; A_{S-1}].T        [T, S * slices * R]   (one GEMM)
    hs   = h * (slot_t == s)                     [T, slices, S, R]     (one kernel: mask
                                                                        and reorder)
    y[:, slice i] += hs[:, i] @ Bt[:, :, slice i]   [T, S*R] @ [S*R, n_i]   (one GEMM each)

The products cover every slot for every token (S times the work of the token's own
slot), which at rank 16 and a few slots is a small share of the base projection; what it
buys is cuBLAS's bandwidth on the output's read-modify-write, the cost that dominates
once a step holds thousands of tokens (round 12 on an H100: the blocked Triton kernels
added 32 ms to a 22 ms prefill step of 7,911 tokens over 4 adapters).

The roundings are the blocked kernels': ``h`` leaves the shrink in the model's dtype
(the float32 sum rounded once, as the expand kernels round it before their dot), the
expand sums in float32 and rounds once into ``y``. Slot -1 tokens get all-zero rows of
``hs`` and keep ``y`` as it was.

``Bt`` is ``lora_b`` transposed per slot (``[S, R, N]``, ``LoRALayer.lora_bt``) so that a
slice's ``[S*R, n_i]`` operand is a view. No host sync, so CUDA graphs capture it too.
Where it runs, from round 12 on an H100 (W1 over 4 adapters + base, one call): from 512
tokens the prefill steps went from 54 to 32 ms (base 22); from 128 the decode steps at
batch 256, which run as CUDA graphs, also went from 10.8 to 10.4 ms (base 8.1). Outside a
graph its torch calls cost more host time than the two Triton launches (q/k/v at 256
tokens: about 78 us a call against 37), so eager steps take it from 512 tokens
(``DENSE_MIN_TOKENS_EAGER``) and captured ones from 128 (``DENSE_MIN_TOKENS``);
``ENGINE_LORA_DENSE_MIN_TOKENS`` sets both. On the CPU only where a test sets
``DENSE_ON_CPU``.
"""

from __future__ import annotations

import os
from collections.abc import Sequence

import torch

_OVERRIDE = os.environ.get("ENGINE_LORA_DENSE_MIN_TOKENS")  # both thresholds, if set
DENSE_MIN_TOKENS = int(_OVERRIDE or 128)  # in a CUDA graph being captured (decode batches)
DENSE_MIN_TOKENS_EAGER = int(_OVERRIDE or 512)  # outside one (prefill chunks, mixed steps)
DENSE_ON_CPU = False


def use_dense(x: torch.Tensor) -> bool:
    """Whether ``x`` [T, K] takes the dense path: enough tokens on a CUDA device, fewer in
    a graph (no host cost per torch call at replay) than outside one."""
    if not x.is_cuda:
        return DENSE_ON_CPU and x.shape[0] >= DENSE_MIN_TOKENS
    capturing = torch.cuda.is_current_stream_capturing()
    return x.shape[0] >= (DENSE_MIN_TOKENS if capturing else DENSE_MIN_TOKENS_EAGER)


def transposed_b(lora_b: torch.Tensor) -> torch.Tensor:
    """``lora_b`` [S, N, R] as the dense expand reads it: ``[S, R, N]``, contiguous."""
    return lora_b.transpose(1, 2).contiguous()


def lora_apply_dense(
    x: torch.Tensor,
    y: torch.Tensor,
    lora_a: torch.Tensor,
    lora_bt: torch.Tensor,
    slots: torch.Tensor,
    slot_ids: torch.Tensor,
    sizes: Sequence[int],
) -> None:
    """``y[t] += B[slots[t]] @ A[slots[t]] @ x[t]`` in place for every token (nothing where
    ``slots[t] < 0``); ``x`` [T, K], ``y`` [T, N] with unit column stride, ``lora_a``
    [S, slices * R, K], ``lora_bt`` [S, R, N], ``slot_ids`` ``arange(S)`` on the device,
    ``sizes`` the slices' output columns."""
    num_tokens, k = x.shape
    num_slots, slice_rows, _ = lora_a.shape
    num_slices = len(sizes)
    rank = slice_rows // num_slices
    assert rank * num_slices == slice_rows and lora_bt.shape[1] == rank
    assert sum(sizes) == y.shape[1] == lora_bt.shape[2] and y.stride(1) == 1
    if num_tokens == 0:
        return
    h = torch.mm(x, lora_a.view(num_slots * slice_rows, k).t())
    # In h's dtype. A boolean mask (promoted inside the product) was the one LoRA change
    # between two H100 calls whose W1 prefill steps over 4 adapters took 32 ms (this
    # form) and 52 ms (boolean), so this form stays; the revert itself was not re-timed.
    mask = (slots[:num_tokens, None] == slot_ids[None, :]).to(h.dtype)
    hs = torch.empty(num_tokens, num_slices, num_slots, rank, dtype=h.dtype, device=h.device)
    torch.mul(
        h.view(num_tokens, num_slots, num_slices, rank),
        mask[:, :, None, None],
        out=hs.permute(0, 2, 1, 3),
    )
    offset = 0
    for i, size in enumerate(sizes):
        cols = slice(offset, offset + size)
        y[:, cols].addmm_(
            hs[:, i].reshape(num_tokens, num_slots * rank),
            lora_bt[:, :, cols].reshape(num_slots * rank, size),
        )
        offset += size
