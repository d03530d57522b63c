"""Fused Triton kernels for the layers' elementwise work on CUDA: RMSNorm (with the residual
add), SiLU-and-mul (also over a merged gate/up output), rope.

Each replaces a chain of small torch kernels (RMSNorm alone is five) with one launch; a
decode step of a 28-layer model launches about a thousand fewer kernels. Arithmetic is in
float32 with one rounding at the end. The torch versions in ``norm.py``,
``activation.py`` and ``rotary.py`` stay the reference and run everywhere else;
``ENGINE_FUSED_OPS=0`` turns these off.
"""

from __future__ import annotations

import functools
import os

import torch

from engine_sdk.interfaces.attention import KVStoreTarget


@functools.lru_cache(maxsize=1)
def _kernels() -> object | None:
    if os.environ.get("ENGINE_FUSED_OPS", "1") == "0":
        return None
    try:
        from engine_sdk.layers import _fused_kernels
    except ImportError:
        return None
    return _fused_kernels


def enabled(x: torch.Tensor) -> bool:
    """Whether the fused path runs for ``x`` (CUDA tensor, Triton importable, not disabled).

    ``ENGINE_FUSED_OPS=force`` also runs it on the CPU (Triton's interpreter, for tests).
    """
    if not x.is_cuda and os.environ.get("ENGINE_FUSED_OPS") != "force":
        return False
    return _kernels() is not None


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    from engine_sdk.layers._fused_kernels import rms_norm_kernel
    from engine_sdk.layers.pdl import pdl_launch

    shape = x.shape
    rows = x.reshape(-1, shape[-1])
    out = torch.empty_like(rows)
    n = shape[-1]
    block = max(16, 1 << (n - 1).bit_length())
    rms_norm_kernel[(rows.shape[0],)](
        rows,
        weight,
        out,
        rows.stride(0),
        out.stride(0),
        n,
        eps,
        BLOCK=block,
        num_warps=4,
        **pdl_launch(rows),
    )
    return out.view(shape)


def add_rms_norm(
    x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, eps: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """``(rms_norm(x + residual), x + residual)`` in one pass over 2-D ``[rows, n]``."""
    from engine_sdk.layers._fused_kernels import add_rms_norm_kernel
    from engine_sdk.layers.pdl import pdl_launch

    rows_x, rows_r = x.reshape(-1, x.shape[-1]), residual.reshape(-1, x.shape[-1])
    out, new_residual = torch.empty_like(rows_x), torch.empty_like(rows_x)
    n = x.shape[-1]
    block = max(16, 1 << (n - 1).bit_length())
    add_rms_norm_kernel[(rows_x.shape[0],)](
        rows_x, rows_r, weight, out, new_residual, rows_x.stride(0), rows_r.stride(0),
        out.stride(0), new_residual.stride(0), n, eps, BLOCK=block, num_warps=4,
        **pdl_launch(rows_x),
    )  # fmt: skip
    return out.view(x.shape), new_residual.view(x.shape)


def silu_and_mul_merged(gate_up: torch.Tensor) -> torch.Tensor:
    """``silu(gate) * up`` for ``gate_up`` = ``[rows, 2 * inter]`` (gate first)."""
    from engine_sdk.layers._fused_kernels import silu_mul_merged_kernel
    from engine_sdk.layers.pdl import pdl_launch

    rows = gate_up.reshape(-1, gate_up.shape[-1])
    inter = rows.shape[-1] // 2
    out = torch.empty(rows.shape[0], inter, dtype=rows.dtype, device=rows.device)
    if rows.shape[0] == 0:
        return out
    block = 1024
    grid = (rows.shape[0], triton_cdiv(inter, block))
    silu_mul_merged_kernel[grid](
        rows, out, rows.stride(0), out.stride(0), inter, BLOCK=block, **pdl_launch(rows)
    )
    return out.view(*gate_up.shape[:-1], inter)


def silu_and_mul(gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
    from engine_sdk.layers._fused_kernels import silu_mul_kernel
    from engine_sdk.layers.pdl import pdl_launch

    gate_c, up_c = gate.contiguous(), up.contiguous()
    out = torch.empty_like(gate_c)
    numel = out.numel()
    block = 1024
    silu_mul_kernel[(triton_cdiv(numel, block),)](
        gate_c, up_c, out, numel, BLOCK=block, **pdl_launch(out)
    )
    return out


def apply_rotary(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """``x`` [tokens, heads, head_dim]; ``cos``/``sin`` [tokens, 1, rotary_dim] (halves equal)."""
    from engine_sdk.layers._fused_kernels import rotary_kernel
    from engine_sdk.layers.pdl import pdl_launch

    num_tokens, num_heads, head_dim = x.shape
    rotary_dim = cos.shape[-1]
    out = torch.empty_like(x)
    if num_tokens == 0:
        return out
    half = rotary_dim // 2
    rotary_kernel[(num_tokens,)](
        x,
        cos,
        sin,
        out,
        x.stride(0),
        x.stride(1),
        out.stride(0),
        out.stride(1),
        cos.stride(0),
        num_heads,
        head_dim,
        half,
        HEADS_P=max(1, 1 << (num_heads - 1).bit_length()),
        HALF_P=max(1, 1 << (half - 1).bit_length()),
        PASS_P=max(1, 1 << max(0, head_dim - rotary_dim - 1).bit_length()),
        HAS_PASS=head_dim > rotary_dim,
        **pdl_launch(x),
    )
    return out


def qkv_norm_rope(
    qkv: torch.Tensor,
    num_q_heads: int,
    num_kv_heads: int,
    q_weight: torch.Tensor | None,
    k_weight: torch.Tensor | None,
    eps: float,
    cos: torch.Tensor,
    sin: torch.Tensor,
    kv_store: KVStoreTarget | None = None,
) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor | None]:
    """Split a merged q/k/v projection ``[tokens, (H + 2 * KV) * D]`` into contiguous q, k
    and v ``[tokens, heads, D]``, with the per-head q/k RMSNorm (when weights are given)
    and rope over the whole head applied to q and k: one launch instead of five (two
    norms, two ropes, the copy that makes v contiguous). ``cos``/``sin``: [tokens, 1, D].

    With ``kv_store`` (the attention backend's ``kv_store_target``) k and v are written
    into the paged KV cache at the step's slots instead (quantized there for an fp8
    cache), and ``(q, None, None)`` is returned: the backend's store launch is not needed."""
    from engine_sdk.layers._fused_kernels import qkv_norm_rope_kernel
    from engine_sdk.layers.pdl import pdl_launch

    num_tokens = qkv.shape[0]
    head_dim = cos.shape[-1]
    shape_q, shape_kv = (num_tokens, num_q_heads, head_dim), (num_tokens, num_kv_heads, head_dim)
    q = torch.empty(shape_q, dtype=qkv.dtype, device=qkv.device)
    k = v = None
    if kv_store is None:
        k = torch.empty(shape_kv, dtype=qkv.dtype, device=qkv.device)
        v = torch.empty(shape_kv, dtype=qkv.dtype, device=qkv.device)
    if num_tokens == 0:
        return q, k, v
    has_norm = q_weight is not None and k_weight is not None
    half = head_dim // 2
    if kv_store is not None:
        k_cache, v_cache = kv_store.k_cache, kv_store.v_cache
        assert k_cache.stride() == v_cache.stride() and k_cache.stride(-1) == 1
        assert k_cache.stride(0) == k_cache.shape[1] * k_cache.stride(1)  # contiguous slots
        cache_args: tuple[object, ...] = (
            k_cache, v_cache, kv_store.slot_mapping, kv_store.kv_scales,
            k_cache.stride(1), k_cache.stride(2),
        )  # fmt: skip
        fp8 = k_cache.dtype == torch.float8_e4m3fn
        if not fp8 and k_cache.dtype != qkv.dtype:
            raise ValueError(
                f"qkv_norm_rope stores into {qkv.dtype} or float8_e4m3fn KV caches, not "
                f"{k_cache.dtype}"
            )
    else:
        cache_args, fp8 = (q, q, q, q, 0, 0), False  # never read without STORE
    qkv_norm_rope_kernel[(num_tokens, 3)](
        qkv, q_weight if has_norm else qkv, k_weight if has_norm else qkv, cos, sin, q,
        q if k is None else k, q if v is None else v,
        qkv.stride(0), cos.stride(0), num_q_heads, num_kv_heads, eps, *cache_args,
        HEAD_DIM=head_dim, HALF_P=max(1, 1 << (half - 1).bit_length()),
        HEADS_P=max(1, 1 << (max(num_q_heads, num_kv_heads) - 1).bit_length()),
        HAS_NORM=has_norm, STORE=kv_store is not None, FP8=fp8, num_warps=4,
        **pdl_launch(qkv),
    )  # fmt: skip
    return q, k, v


def triton_cdiv(a: int, b: int) -> int:
    return -(-a // b)
