# mypy: disable-error-code="no-untyped-def,untyped-decorator"
"""Triton kernels behind ``fused_ops`` (imported only when the fused path runs)."""

from __future__ import annotations

import triton
import triton.language as tl

from engine_sdk.layers.pdl import pdl_start


@triton.jit
def rms_norm_kernel(
    x_ptr,
    w_ptr,
    out_ptr,
    stride_x,
    stride_o,
    n,
    eps,
    BLOCK: tl.constexpr,
    PDL: tl.constexpr = False,
):
    pdl_start(PDL)
    row = tl.program_id(0)
    offs = tl.arange(0, BLOCK)
    mask = offs < n
    x = tl.load(x_ptr + row * stride_x + offs, mask=mask, other=0.0).to(tl.float32)
    var = tl.sum(x * x, 0) / n
    # Round the normalised value to the input dtype before the weight multiply, as HF does.
    y = (x * tl.rsqrt(var + eps)).to(out_ptr.dtype.element_ty).to(tl.float32)
    w = tl.load(w_ptr + offs, mask=mask, other=0.0).to(tl.float32)
    tl.store(out_ptr + row * stride_o + offs, (y * w).to(out_ptr.dtype.element_ty), mask=mask)


@triton.jit
def silu_mul(g, u):
    """``silu(g) * u`` in float32 from float32 ``g`` and ``u``: the one formula of every
    SiLU-and-multiply kernel (``_lora_kernels`` too), so their roundings agree."""
    return g / (1.0 + tl.exp(-g)) * u


@triton.jit
def silu_mul_kernel(
    gate_ptr, up_ptr, out_ptr, numel, BLOCK: tl.constexpr, PDL: tl.constexpr = False
):
    pdl_start(PDL)
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < numel
    g = tl.load(gate_ptr + offs, mask=mask, other=0.0).to(tl.float32)
    u = tl.load(up_ptr + offs, mask=mask, other=0.0).to(tl.float32)
    out = silu_mul(g, u)
    tl.store(out_ptr + offs, out.to(out_ptr.dtype.element_ty), mask=mask)


@triton.jit
def rotary_kernel(
    x_ptr,
    cos_ptr,
    sin_ptr,
    out_ptr,
    stride_xt,
    stride_xh,
    stride_ot,
    stride_oh,
    stride_ct,
    num_heads,
    head_dim,
    half,
    HEADS_P: tl.constexpr,
    HALF_P: tl.constexpr,
    PASS_P: tl.constexpr,
    HAS_PASS: tl.constexpr,
    PDL: tl.constexpr = False,
):
    # One program per token, all heads: out1 = x1*c - x2*s, out2 = x2*c + x1*s over the
    # rotary half-dims; dims past 2*half pass through unchanged.
    pdl_start(PDL)
    tok = tl.program_id(0)
    heads = tl.arange(0, HEADS_P)[:, None]
    dims = tl.arange(0, HALF_P)[None, :]
    mask = (heads < num_heads) & (dims < half)
    c = tl.load(cos_ptr + tok * stride_ct + dims, mask=dims < half, other=0.0).to(tl.float32)
    s = tl.load(sin_ptr + tok * stride_ct + dims, mask=dims < half, other=0.0).to(tl.float32)
    base_x = x_ptr + tok * stride_xt + heads * stride_xh
    base_o = out_ptr + tok * stride_ot + heads * stride_oh
    x1 = tl.load(base_x + dims, mask=mask, other=0.0).to(tl.float32)
    x2 = tl.load(base_x + half + dims, mask=mask, other=0.0).to(tl.float32)
    ty = out_ptr.dtype.element_ty
    tl.store(base_o + dims, (x1 * c - x2 * s).to(ty), mask=mask)
    tl.store(base_o + half + dims, (x2 * c + x1 * s).to(ty), mask=mask)
    if HAS_PASS:
        rest = tl.arange(0, PASS_P)[None, :]
        pmask = (heads < num_heads) & (rest < head_dim - 2 * half)
        keep = tl.load(base_x + 2 * half + rest, mask=pmask, other=0.0)
        tl.store(base_o + 2 * half + rest, keep, mask=pmask)


@triton.jit
def add_rms_norm_kernel(
    x_ptr, r_ptr, w_ptr, out_ptr, res_ptr, stride_x, stride_r, stride_o, stride_s, n, eps,
    BLOCK: tl.constexpr,
    PDL: tl.constexpr = False,
):  # fmt: skip
    # s = x + residual (rounded to the dtype, as the unfused add stores it), then RMSNorm(s).
    pdl_start(PDL)
    row = tl.program_id(0)
    offs = tl.arange(0, BLOCK)
    mask = offs < n
    x = tl.load(x_ptr + row * stride_x + offs, mask=mask, other=0.0).to(tl.float32)
    r = tl.load(r_ptr + row * stride_r + offs, mask=mask, other=0.0).to(tl.float32)
    s = (x + r).to(res_ptr.dtype.element_ty)
    tl.store(res_ptr + row * stride_s + offs, s, mask=mask)
    s32 = s.to(tl.float32)
    var = tl.sum(s32 * s32, 0) / n
    y = (s32 * tl.rsqrt(var + eps)).to(out_ptr.dtype.element_ty).to(tl.float32)
    w = tl.load(w_ptr + offs, mask=mask, other=0.0).to(tl.float32)
    tl.store(out_ptr + row * stride_o + offs, (y * w).to(out_ptr.dtype.element_ty), mask=mask)


@triton.jit
def silu_mul_merged_kernel(
    gu_ptr, out_ptr, stride_gu, stride_o, inter, BLOCK: tl.constexpr, PDL: tl.constexpr = False
):
    # gu rows are [gate | up] (one merged GEMM); out = silu(gate) * up.
    pdl_start(PDL)
    row = tl.program_id(0)
    offs = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < inter
    g = tl.load(gu_ptr + row * stride_gu + offs, mask=mask, other=0.0).to(tl.float32)
    u = tl.load(gu_ptr + row * stride_gu + inter + offs, mask=mask, other=0.0).to(tl.float32)
    out = silu_mul(g, u)
    tl.store(out_ptr + row * stride_o + offs, out.to(out_ptr.dtype.element_ty), mask=mask)


@triton.jit
def _store_cache_heads(
    cache_ptr, slot, heads, dims, half, mask, stride_ch, scale_ptr, x1, x2, FP8: tl.constexpr
):  # fmt: skip
    """Store a token's heads (halves ``x1``, ``x2``, in the model dtype) at ``cache_ptr``,
    its cache slot (``slot`` < 0: nowhere); an fp8 cache gets ``fp8(clamp(x / scale))`` (IEEE
    division, the Triton attention backend's store)."""
    dst = cache_ptr + heads * stride_ch
    ok = mask & (slot >= 0)
    ty = cache_ptr.dtype.element_ty
    if FP8:
        scale = tl.load(scale_ptr)
        x1 = tl.minimum(tl.maximum(tl.math.div_rn(x1.to(tl.float32), scale), -448.0), 448.0)
        x2 = tl.minimum(tl.maximum(tl.math.div_rn(x2.to(tl.float32), scale), -448.0), 448.0)
    tl.store(dst + dims, x1.to(ty), mask=ok)
    tl.store(dst + half + dims, x2.to(ty), mask=ok)


@triton.jit
def qkv_norm_rope_kernel(
    qkv_ptr, qw_ptr, kw_ptr, cos_ptr, sin_ptr, q_ptr, k_ptr, v_ptr,
    stride_t, stride_ct, num_q_heads, num_kv_heads, eps,
    k_cache_ptr, v_cache_ptr, slot_ptr, kv_scales_ptr, stride_cs, stride_ch,
    HEAD_DIM: tl.constexpr, HALF_P: tl.constexpr, HEADS_P: tl.constexpr,
    HAS_NORM: tl.constexpr, STORE: tl.constexpr = False, FP8: tl.constexpr = False,
    PDL: tl.constexpr = False,
):  # fmt: skip
    # One program per (token, part): part 0 the q heads, 1 the k heads (optional per-head
    # RMSNorm, then rope over the whole head), 2 the v heads (copied). A row of qkv is
    #   [ q: num_q_heads * D | k: num_kv_heads * D | v: num_kv_heads * D ]
    # and each output is a contiguous [tokens, heads, D] tensor. The arithmetic and its
    # roundings are those of the separate kernels (norm output rounded to the dtype, times
    # the weight, rounded; rope in float32 from the rounded values). With STORE, k and v
    # go to the paged KV cache instead, at the token's slot (``slot * stride_cs``, heads
    # ``stride_ch`` apart), quantized there for an fp8 cache (FP8, scales [k, v]).
    pdl_start(PDL)
    tok = tl.program_id(0)
    part = tl.program_id(1)
    half = HEAD_DIM // 2
    heads = tl.arange(0, HEADS_P)[:, None]
    dims = tl.arange(0, HALF_P)[None, :]
    row = qkv_ptr + tok * stride_t
    if part == 2:
        vmask = (heads < num_kv_heads) & (dims < half)
        src = row + (num_q_heads + num_kv_heads) * HEAD_DIM + heads * HEAD_DIM
        v1 = tl.load(src + dims, mask=vmask)
        v2 = tl.load(src + half + dims, mask=vmask)
        if STORE:
            slot = tl.load(slot_ptr + tok)
            _store_cache_heads(
                v_cache_ptr + slot.to(tl.int64) * stride_cs, slot, heads, dims, half, vmask,
                stride_ch, kv_scales_ptr + 1, v1, v2, FP8,
            )  # fmt: skip
        else:
            dst = v_ptr + tok * num_kv_heads * HEAD_DIM + heads * HEAD_DIM
            tl.store(dst + dims, v1, mask=vmask)
            tl.store(dst + half + dims, v2, mask=vmask)
    else:
        if part == 0:
            num_heads = num_q_heads
            src = row + heads * HEAD_DIM
            out = q_ptr + tok * num_q_heads * HEAD_DIM + heads * HEAD_DIM
            w_ptr = qw_ptr
        else:
            num_heads = num_kv_heads
            src = row + num_q_heads * HEAD_DIM + heads * HEAD_DIM
            out = k_ptr + tok * num_kv_heads * HEAD_DIM + heads * HEAD_DIM
            w_ptr = kw_ptr
        mask = (heads < num_heads) & (dims < half)
        ty = q_ptr.dtype.element_ty
        x1 = tl.load(src + dims, mask=mask, other=0.0).to(tl.float32)
        x2 = tl.load(src + half + dims, mask=mask, other=0.0).to(tl.float32)
        if HAS_NORM:
            var = (tl.sum(x1 * x1, 1) + tl.sum(x2 * x2, 1))[:, None] / HEAD_DIM
            inv = tl.rsqrt(var + eps)
            w1 = tl.load(w_ptr + dims, mask=dims < half, other=0.0).to(tl.float32)
            w2 = tl.load(w_ptr + half + dims, mask=dims < half, other=0.0).to(tl.float32)
            x1 = ((x1 * inv).to(ty).to(tl.float32) * w1).to(ty).to(tl.float32)
            x2 = ((x2 * inv).to(ty).to(tl.float32) * w2).to(ty).to(tl.float32)
        c = tl.load(cos_ptr + tok * stride_ct + dims, mask=dims < half, other=0.0).to(tl.float32)
        s = tl.load(sin_ptr + tok * stride_ct + dims, mask=dims < half, other=0.0).to(tl.float32)
        y1 = (x1 * c - x2 * s).to(ty)
        y2 = (x2 * c + x1 * s).to(ty)
        if STORE and part == 1:
            slot = tl.load(slot_ptr + tok)
            _store_cache_heads(
                k_cache_ptr + slot.to(tl.int64) * stride_cs, slot, heads, dims, half, mask,
                stride_ch, kv_scales_ptr, y1, y2, FP8,
            )  # fmt: skip
        else:
            tl.store(out + dims, y1, mask=mask)
            tl.store(out + half + dims, y2, mask=mask)
