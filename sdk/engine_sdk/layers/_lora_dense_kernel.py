# mypy: disable-error-code="no-untyped-def,untyped-decorator"
"""The dense LoRA path's expand as one Triton GEMM that masks as it loads
(:func:`engine_sdk.layers.lora_dense.lora_apply_dense`)::

    y[t, n] += sum_j  h[t, j] * (slot_t == j // ROWS_PER_SLOT) * Bt[j, n]

``h`` [T, S * ROWS_PER_SLOT] is the unmasked shrink of every slot, ``Bt`` the block
-diagonal ``[S * ROWS_PER_SLOT, N]`` (``lora_dense.block_bt``), ``slot_t`` from the token
slots (-1 matches no column: the row of ``y`` stays as it was). One launch replaces the
mask lookup, its product and cuBLAS's ``addmm_``; the output tile is read, added to in
float32 and rounded once, as ``addmm_`` does.
"""

from __future__ import annotations

import triton
import triton.language as tl


# Neither the token count nor a projection's rows per slot are specialized on: the only
# variants are the tiles of ``lora_dense.dense_tiles`` (three, compiled at startup by
# ``lora_dense.warm_up_dense``), so no step compiles a kernel while requests wait.
@triton.jit(do_not_specialize=["T", "ROWS_PER_SLOT"])
def lora_dense_expand_kernel(
    h_ptr, bt_ptr, y_ptr, slots_ptr,
    T, N, KE, stride_h, stride_bt, stride_y, ROWS_PER_SLOT,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr, DOT_PRECISION: tl.constexpr,
):  # fmt: skip
    offs_m = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    mask_m = offs_m < T
    mask_n = offs_n < N
    slot = tl.load(slots_ptr + offs_m, mask=mask_m, other=-1)
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k0 in range(0, KE, BLOCK_K):
        offs_k = k0 + tl.arange(0, BLOCK_K)
        mask_k = offs_k < KE
        keep = (slot[:, None] == (offs_k // ROWS_PER_SLOT)[None, :]) & mask_k[None, :]
        h = tl.load(h_ptr + offs_m[:, None] * stride_h + offs_k[None, :],
                    mask=keep & mask_m[:, None], other=0.0)  # fmt: skip
        b = tl.load(bt_ptr + offs_k[:, None] * stride_bt + offs_n[None, :],
                    mask=mask_k[:, None] & mask_n[None, :], other=0.0)  # fmt: skip
        acc = tl.dot(h, b, acc, input_precision=DOT_PRECISION)
    y_ptrs = y_ptr + offs_m[:, None] * stride_y + offs_n[None, :]
    tile = mask_m[:, None] & mask_n[None, :]
    y = tl.load(y_ptrs, mask=tile, other=0.0)
    tl.store(y_ptrs, (y.to(tl.float32) + acc).to(y.dtype), mask=tile)
