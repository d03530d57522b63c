# mypy: disable-error-code="no-untyped-def,untyped-decorator"
"""Triton kernel behind ``sampling.RowSampler`` (imported only when it runs)."""

from __future__ import annotations

import triton
import triton.language as tl

from engine_sdk.layers.pdl import pdl_start


@triton.jit
def sample_rows_kernel(
    logits_ptr, temps_ptr, step_ptr, part_val_ptr, part_idx_ptr, lock_ptr, out_ptr,
    V, stride_l, num_rows, NUM_CHUNKS, bits_ptr, stride_b,
    BLOCK: tl.constexpr, CHUNKS_P: tl.constexpr, MASKED: tl.constexpr = False,
    PDL: tl.constexpr = False,
):  # fmt: skip
    """Program (row, chunk): the best column of ``BLOCK`` logits of one row, by value
    (temperature 0: greedy) or by value / temperature + Gumbel noise (a sample of
    softmax(logits / temperature)); the last chunk of a row to finish (an acq_rel counter
    per row) picks the row's best over the chunks (ties: the lowest id, as ``argmax``) and
    the last row to finish advances the step counter that keys the noise, so every launch
    draws fresh noise. Counters are zero between launches (CUDA graphs replay them).
    ``MASKED``: a packed allowed-token row per row (``bits_ptr``, ``stride_b`` bytes a row:
    bit ``id % 8`` of byte ``id // 8`` set where ``id`` may be drawn); the other ids are
    ``-inf`` before the temperature and the noise, as the sampler's masked path."""
    pdl_start(PDL)
    row = tl.program_id(0)
    chunk = tl.program_id(1)
    step = tl.load(step_ptr)
    temp = tl.load(temps_ptr + row)
    offs = chunk * BLOCK + tl.arange(0, BLOCK)
    ok = offs < V
    x = tl.load(logits_ptr + row.to(tl.int64) * stride_l + offs, mask=ok, other=float("-inf"))
    x = x.to(tl.float32)
    if MASKED:
        byte = tl.load(bits_ptr + row.to(tl.int64) * stride_b + (offs >> 3), mask=ok, other=0)
        allowed = ((byte.to(tl.int32) >> (offs & 7)) & 1) != 0
        x = tl.where(allowed, x, float("-inf"))
    if temp > 0.0:
        u = tl.rand(step, row * V + offs)  # uniform [0, 1), Philox keyed by the step
        gumbel = -tl.log(-tl.log(u))
        x = tl.where(ok, x / temp + gumbel, float("-inf"))
    best = tl.max(x, 0)
    best_col = tl.argmax(x, 0, tie_break_left=True) + chunk * BLOCK
    tl.store(part_val_ptr + row * CHUNKS_P + chunk, best)
    tl.store(part_idx_ptr + row * CHUNKS_P + chunk, best_col)
    tl.debug_barrier()
    arrived = tl.atomic_add(lock_ptr + row, 1, sem="acq_rel", scope="gpu")
    if arrived == NUM_CHUNKS - 1:
        chunks = tl.arange(0, CHUNKS_P)
        have = chunks < NUM_CHUNKS
        vals = tl.load(
            part_val_ptr + row * CHUNKS_P + chunks, mask=have, other=float("-inf"),
            cache_modifier=".cg",
        )  # fmt: skip
        cols = tl.load(
            part_idx_ptr + row * CHUNKS_P + chunks, mask=have, other=0, cache_modifier=".cg"
        )
        top = tl.max(vals, 0)
        # the lowest column among the chunks holding the maximum (chunks are in id order)
        pick = tl.min(tl.where((vals == top) & have, cols, V), 0)
        pick = tl.where(pick == V, 0, pick)  # a row of -inf / NaN only: id 0
        tl.store(out_ptr + row, pick.to(tl.int64))
        tl.atomic_xchg(lock_ptr + row, 0, sem="relaxed", scope="gpu")
        done = tl.atomic_add(lock_ptr + num_rows, 1, sem="acq_rel", scope="gpu")
        if done == num_rows - 1:
            tl.store(step_ptr, step + 1)
            tl.atomic_xchg(lock_ptr + num_rows, 0, sem="relaxed", scope="gpu")
