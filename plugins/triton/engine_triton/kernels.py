"""Triton kernels: store new K/V into the paged cache, and paged attention.

One attention program handles ``BLOCK_Q`` query tokens of one sequence and the ``G`` query
heads that share one KV head (GQA), packed into ``BLOCK_M = BLOCK_Q * G`` rows::

    row m  ->  token  qb * BLOCK_Q + m // G,   head  kv_head * G + m % G

so each K/V tile loaded from the cache is used by all heads of its group. The program walks
the sequence's KV positions ``0 .. ctx_len + last_token`` in tiles of ``BLOCK_N`` tokens;
a tile may span several cache blocks, each token's block found through the block table.
Row ``m`` sees KV position ``n`` when ``n <= ctx_len + token(m)`` (causal with the cached
prefix in front). Softmax is computed online in float32.

fp8 KV cache (``FP8`` constexpr; without it the generated code is unchanged): the store
writes ``clamp(x / scale, -FP8_MAX, FP8_MAX)`` cast to the cache's fp8 type; attention
loads fp8 tiles, converts them exactly to the query dtype and applies the per-tensor scales
outside the dots: ``k_scale`` folds into the softmax scale (``q . (k8 * ks) = (q . k8) *
ks``) and ``v_scale`` multiplies the normalized output (``sum p * v8 * vs``). Scales are
read from a device tensor ``[k_scale, v_scale]``, so captured CUDA graphs see updates.

Split KV (decode, ``SPLITS > 1``): a batch of few sequences has too few (sequence, KV
head) programs to keep the multiprocessors loading, so each is split along the KV
positions into ``SPLITS`` programs (the third grid axis). Split ``s`` covers ``chunk``
positions from ``s * chunk`` (``chunk``: the sequence's length over ``SPLITS``, rounded up
to whole tiles; splits past the end do nothing) and writes its unnormalized output and
its running max and sum to float32 workspaces, which are merged::

    out = sum_s exp2(m_s - M) * acc_s / sum_s exp2(m_s - M) * l_s,    M = max_s m_s

With ``COMBINE`` the merge is in the same launch (one launch a layer instead of two at
decode): after writing its part, a split adds one to its (sequence, KV head)'s counter in
``lock_ptr`` (acq_rel); the split that finds ``SPLITS - 1`` there is the last, reads the
parts back from L2, merges the group's heads and puts the counter back to 0, so the
counters are zero between launches and CUDA graphs replay them without a memset (the
GEMVs' split-K, ``engine_sdk.layers.split_k``, works the same way). Without it,
``combine_splits_kernel`` merges in a second launch.
"""

from __future__ import annotations

import triton
import triton.language as tl
from engine_sdk.layers.pdl import pdl_start


@triton.jit
def store_kv_kernel(
    key_ptr,
    value_ptr,
    k_cache_ptr,
    v_cache_ptr,
    slot_ptr,
    stride_kt,
    stride_kh,
    stride_vt,
    stride_vh,
    stride_cs,  # cache stride per slot (block_size * ... flattened: one token)
    stride_ch,
    kv_scales_ptr,  # float32 [k_scale, v_scale]; read only when FP8
    NUM_KV_HEADS: tl.constexpr,
    NUM_KV_HEADS_P: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    HEAD_DIM_P: tl.constexpr,
    FP8: tl.constexpr = False,
    FP8_MAX: tl.constexpr = 448.0,
    PDL: tl.constexpr = False,
):
    pdl_start(PDL)
    token = tl.program_id(0)
    slot = tl.load(slot_ptr + token)
    if slot < 0:
        return
    offs_h = tl.arange(0, NUM_KV_HEADS_P)
    offs_d = tl.arange(0, HEAD_DIM_P)
    mask = (offs_h[:, None] < NUM_KV_HEADS) & (offs_d[None, :] < HEAD_DIM)
    src_k = key_ptr + token * stride_kt + offs_h[:, None] * stride_kh + offs_d[None, :]
    src_v = value_ptr + token * stride_vt + offs_h[:, None] * stride_vh + offs_d[None, :]
    dst = slot * stride_cs + offs_h[:, None] * stride_ch + offs_d[None, :]
    k = tl.load(src_k, mask=mask)
    v = tl.load(src_v, mask=mask)
    if FP8:
        k_scale = tl.load(kv_scales_ptr)
        v_scale = tl.load(kv_scales_ptr + 1)
        # IEEE division (div_rn), not the GPU's default approximate one: a quotient near
        # the midpoint of two fp8 values (common for bf16 inputs) must round as torch does.
        k = tl.minimum(tl.maximum(tl.math.div_rn(k.to(tl.float32), k_scale), -FP8_MAX), FP8_MAX)
        v = tl.minimum(tl.maximum(tl.math.div_rn(v.to(tl.float32), v_scale), -FP8_MAX), FP8_MAX)
    tl.store(k_cache_ptr + dst, k.to(k_cache_ptr.dtype.element_ty), mask=mask)
    tl.store(v_cache_ptr + dst, v.to(v_cache_ptr.dtype.element_ty), mask=mask)


@triton.jit
def _attend_tile(
    q, acc, m_i, l_i, start_n, kv_end, q_pos, qk_scale, seq, kv_head,
    k_cache_ptr, v_cache_ptr, block_tables_ptr, stride_bt, stride_cb, stride_ct, stride_ch,
    offs_d, d_ok,
    BLOCK_SIZE: tl.constexpr, BLOCK_N: tl.constexpr, DOT_PRECISION: tl.constexpr,
    WINDOW: tl.constexpr, SOFT_CAP: tl.constexpr, MASKED: tl.constexpr, EVEN_D: tl.constexpr,
):  # fmt: skip
    """One KV tile of the online softmax; ``MASKED``: the tile may cross the causal edge or
    the end of the sequence (otherwise every row sees every position of it)."""
    offs_n = start_n + tl.arange(0, BLOCK_N)
    if MASKED:
        n_ok = offs_n < kv_end
        block_ids = tl.load(
            block_tables_ptr + seq * stride_bt + offs_n // BLOCK_SIZE, mask=n_ok, other=0
        )
    else:
        block_ids = tl.load(block_tables_ptr + seq * stride_bt + offs_n // BLOCK_SIZE)
    kv_off = (
        block_ids.to(tl.int64) * stride_cb + (offs_n % BLOCK_SIZE) * stride_ct + kv_head * stride_ch
    )
    if MASKED:
        kv_mask = n_ok[:, None] & d_ok[None, :]
        k = tl.load(k_cache_ptr + kv_off[:, None] + offs_d[None, :], mask=kv_mask, other=0.0)
        v = tl.load(v_cache_ptr + kv_off[:, None] + offs_d[None, :], mask=kv_mask, other=0.0)
    elif EVEN_D:
        k = tl.load(k_cache_ptr + kv_off[:, None] + offs_d[None, :])
        v = tl.load(v_cache_ptr + kv_off[:, None] + offs_d[None, :])
    else:
        k = tl.load(k_cache_ptr + kv_off[:, None] + offs_d[None, :], mask=d_ok[None, :], other=0.0)
        v = tl.load(v_cache_ptr + kv_off[:, None] + offs_d[None, :], mask=d_ok[None, :], other=0.0)

    s = tl.dot(q, tl.trans(k).to(q.dtype), input_precision=DOT_PRECISION) * qk_scale
    if SOFT_CAP > 0.0:  # s is in log2 units here: cap in those units, tanh = 2 sig(2x) - 1
        cap2 = SOFT_CAP * 1.4426950408889634
        s = cap2 * (2.0 * tl.sigmoid(2.0 * s / cap2) - 1.0)
    if MASKED:
        visible = (offs_n[None, :] <= q_pos[:, None]) & n_ok[None, :]
        if WINDOW > 0:
            visible = visible & (offs_n[None, :] > q_pos[:, None] - WINDOW)
        s = tl.where(visible, s, float("-inf"))
    elif WINDOW > 0:
        s = tl.where(offs_n[None, :] > q_pos[:, None] - WINDOW, s, float("-inf"))

    m_new = tl.maximum(m_i, tl.max(s, 1))
    # Rows that have seen nothing yet keep m = -inf; guard the subtraction.
    m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)
    p = tl.math.exp2(s - m_safe[:, None])
    alpha = tl.math.exp2(m_i - m_safe)
    l_i = l_i * alpha + tl.sum(p, 1)
    pv = tl.dot(p.to(q.dtype), v.to(q.dtype), input_precision=DOT_PRECISION)
    acc = acc * alpha[:, None] + pv.to(tl.float32)
    return acc, m_new, l_i


# stride_bt is the widest block table of the step: it changes from step to step, and Triton
# would compile a variant per value class (1, multiple of 16, other) in the middle of a run.
@triton.jit(do_not_specialize=["stride_bt"])
def paged_attention_kernel(
    q_ptr,
    k_cache_ptr,
    v_cache_ptr,
    out_ptr,
    block_tables_ptr,
    seq_lens_ptr,
    query_start_ptr,
    work_seq_ptr,
    work_qblock_ptr,
    scale,
    stride_qt,
    stride_qh,
    stride_ot,
    stride_oh,
    stride_cb,  # cache stride per block
    stride_ct,  # cache stride per token within a block
    stride_ch,  # cache stride per KV head
    stride_bt,  # block table stride per sequence
    kv_scales_ptr,  # float32 [k_scale, v_scale]; read only when FP8
    GROUP: tl.constexpr,
    BLOCK_SIZE: tl.constexpr,
    BLOCK_Q: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    HEAD_DIM_P: tl.constexpr,
    DOT_PRECISION: tl.constexpr,
    FP8: tl.constexpr = False,
    WINDOW: tl.constexpr = 0,  # sliding window in tokens (0: none): key pos > query pos - WINDOW
    SOFT_CAP: tl.constexpr = 0.0,  # Gemma 2 logit soft cap (0: none): cap * tanh(s / cap)
    SPLITS: tl.constexpr = 1,  # KV splits per program row (decode; see the module doc)
    part_acc_ptr=None,  # float32 [tokens, heads, SPLITS, HEAD_DIM_P] when SPLITS > 1
    part_ml_ptr=None,  # float32 [tokens, heads, SPLITS, 2]: running max (log2 units), sum
    COMBINE: tl.constexpr = False,  # SPLITS > 1: the last split to finish merges (lock_ptr)
    lock_ptr=None,  # int32 [programs along axis 0 * KV heads], zero before and after
    PDL: tl.constexpr = False,
):
    pdl_start(PDL)
    work = tl.program_id(0)
    kv_head = tl.program_id(1)
    seq = tl.load(work_seq_ptr + work)
    qblock = tl.load(work_qblock_ptr + work)

    q_start = tl.load(query_start_ptr + seq)
    q_len = tl.load(query_start_ptr + seq + 1) - q_start
    seq_len = tl.load(seq_lens_ptr + seq)
    ctx_len = seq_len - q_len

    offs_m = tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, HEAD_DIM_P)
    tok = qblock * BLOCK_Q + offs_m // GROUP
    head = kv_head * GROUP + offs_m % GROUP
    row_ok = (offs_m < BLOCK_Q * GROUP) & (tok < q_len)
    d_ok = offs_d < HEAD_DIM

    q_ptrs = q_ptr + (q_start + tok)[:, None] * stride_qt + head[:, None] * stride_qh
    q = tl.load(q_ptrs + offs_d[None, :], mask=row_ok[:, None] & d_ok[None, :], other=0.0)
    q_pos = ctx_len + tok  # absolute position of each row's token

    last_tok = tl.minimum((qblock + 1) * BLOCK_Q, q_len) - 1
    kv_end = ctx_len + last_tok + 1

    m_i = tl.full([BLOCK_M], float("-inf"), dtype=tl.float32)
    l_i = tl.zeros([BLOCK_M], dtype=tl.float32)
    acc = tl.zeros([BLOCK_M, HEAD_DIM_P], dtype=tl.float32)
    # log2(e): use exp2. float32 whatever the caller passes (torch.compile hands a float64).
    qk_scale = tl.full([], scale * 1.4426950408889634, tl.float32)
    if FP8:
        qk_scale = qk_scale * tl.load(kv_scales_ptr)

    kv_start = 0
    if WINDOW > 0:  # skip the tiles wholly outside the first row's window
        first_pos = ctx_len + qblock * BLOCK_Q
        kv_start = tl.maximum(first_pos - WINDOW + 1, 0) // BLOCK_N * BLOCK_N
    split = 0
    if SPLITS > 1:
        split = tl.program_id(2)
        chunk = tl.cdiv(tl.cdiv(kv_end, SPLITS), BLOCK_N) * BLOCK_N
        kv_start = tl.maximum(kv_start, split * chunk)
        kv_end = tl.minimum(kv_end, (split + 1) * chunk)
    # Query blocks (prefill): the tiles wholly at or below the first row's position need no
    # causal or bounds mask. Decode keeps one masked loop (measured faster at batch 64-256).
    full_end = kv_start
    if BLOCK_Q > 1:
        full_end = (ctx_len + qblock * BLOCK_Q + 1) // BLOCK_N * BLOCK_N
        full_end = tl.minimum(tl.maximum(full_end, kv_start), kv_end)
    for start_n in range(kv_start, full_end, BLOCK_N):
        acc, m_i, l_i = _attend_tile(
            q, acc, m_i, l_i, start_n, kv_end, q_pos, qk_scale, seq, kv_head,
            k_cache_ptr, v_cache_ptr, block_tables_ptr, stride_bt, stride_cb, stride_ct,
            stride_ch, offs_d, d_ok, BLOCK_SIZE, BLOCK_N, DOT_PRECISION, WINDOW, SOFT_CAP,
            False, HEAD_DIM == HEAD_DIM_P,
        )  # fmt: skip
    for start_n in range(full_end, kv_end, BLOCK_N):
        acc, m_i, l_i = _attend_tile(
            q, acc, m_i, l_i, start_n, kv_end, q_pos, qk_scale, seq, kv_head,
            k_cache_ptr, v_cache_ptr, block_tables_ptr, stride_bt, stride_cb, stride_ct,
            stride_ch, offs_d, d_ok, BLOCK_SIZE, BLOCK_N, DOT_PRECISION, WINDOW, SOFT_CAP,
            True, HEAD_DIM == HEAD_DIM_P,
        )  # fmt: skip

    if SPLITS > 1:  # unnormalized partial output, max and sum; the last split merges them
        if FP8:
            acc = acc * tl.load(kv_scales_ptr + 1)
        num_heads = tl.num_programs(1) * GROUP
        part = ((q_start + tok) * num_heads + head) * SPLITS + split
        tl.store(
            part_acc_ptr + part[:, None] * HEAD_DIM_P + offs_d[None, :], acc, mask=row_ok[:, None]
        )
        tl.store(part_ml_ptr + part * 2, m_i, mask=row_ok)
        tl.store(part_ml_ptr + part * 2 + 1, l_i, mask=row_ok)
        if COMBINE:
            # Every thread's part is written before one thread announces it (release); the
            # last split's acquire makes the other splits' parts visible to its loads.
            tl.debug_barrier()
            lock = lock_ptr + work * tl.num_programs(1) + kv_head
            arrived = tl.atomic_add(lock, 1, sem="acq_rel", scope="gpu")
            if arrived == SPLITS - 1:
                # BLOCK_Q is 1 here (decode): rows 0 .. GROUP - 1 are the group's heads
                for g in tl.static_range(GROUP):
                    _combine_head(
                        part_acc_ptr, part_ml_ptr, out_ptr,
                        ((q_start * num_heads + kv_head * GROUP + g) * SPLITS).to(tl.int64),
                        q_start * stride_ot + (kv_head * GROUP + g) * stride_oh,
                        ".cg", SPLITS, HEAD_DIM, HEAD_DIM_P,
                    )  # fmt: skip
                tl.atomic_xchg(lock, 0, sem="relaxed", scope="gpu")
        return
    l_safe = tl.where(l_i == 0.0, 1.0, l_i)
    out = acc / l_safe[:, None]
    if FP8:
        out = out * tl.load(kv_scales_ptr + 1)
    o_ptrs = out_ptr + (q_start + tok)[:, None] * stride_ot + head[:, None] * stride_oh
    tl.store(
        o_ptrs + offs_d[None, :],
        out.to(out_ptr.dtype.element_ty),
        mask=row_ok[:, None] & d_ok[None, :],
    )


@triton.jit
def _combine_head(
    part_acc_ptr, part_ml_ptr, out_ptr, first_part, out_off, CACHE: tl.constexpr,
    SPLITS: tl.constexpr, HEAD_DIM: tl.constexpr, HEAD_DIM_P: tl.constexpr,
):  # fmt: skip
    """Merge one (token, head)'s ``SPLITS`` partial outputs (parts ``first_part ..``) into
    ``out_ptr + out_off``; ``CACHE``: the loads' cache modifier (``.cg``, from L2, when
    other programs of the same launch wrote the parts)."""
    part = first_part + tl.arange(0, SPLITS)
    m = tl.load(part_ml_ptr + part * 2, cache_modifier=CACHE)
    l_s = tl.load(part_ml_ptr + part * 2 + 1, cache_modifier=CACHE)
    m_max = tl.max(m, 0)
    m_safe = tl.where(m_max == float("-inf"), 0.0, m_max)
    w = tl.where(m == float("-inf"), 0.0, tl.math.exp2(m - m_safe))
    offs_d = tl.arange(0, HEAD_DIM_P)
    acc = tl.load(part_acc_ptr + part[:, None] * HEAD_DIM_P + offs_d[None, :], cache_modifier=CACHE)
    total = tl.sum(w * l_s, 0)
    out = tl.sum(acc * w[:, None], 0) / tl.where(total == 0.0, 1.0, total)
    tl.store(out_ptr + out_off + offs_d, out.to(out_ptr.dtype.element_ty), mask=offs_d < HEAD_DIM)


@triton.jit
def combine_splits_kernel(
    part_acc_ptr,
    part_ml_ptr,
    out_ptr,
    stride_ot,
    stride_oh,
    SPLITS: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    HEAD_DIM_P: tl.constexpr,
    PDL: tl.constexpr = False,
):
    """One (token, head): merge the ``SPLITS`` partial outputs of ``paged_attention_kernel``
    (launched with ``COMBINE=False``)."""
    pdl_start(PDL)
    token = tl.program_id(0)
    head = tl.program_id(1)
    first = (token * tl.num_programs(1) + head) * SPLITS
    _combine_head(
        part_acc_ptr, part_ml_ptr, out_ptr, first, token * stride_ot + head * stride_oh, "",
        SPLITS, HEAD_DIM, HEAD_DIM_P,
    )  # fmt: skip
