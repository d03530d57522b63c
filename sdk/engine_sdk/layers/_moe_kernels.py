# mypy: disable-error-code="no-untyped-def,untyped-decorator"
"""Triton grouped GEMMs for ``FusedMoE``: tokens sorted by expert, gate+up+SiLU fused.

Each token's ``top_k`` choices are flattened into *slots* (``slot = token * top_k + k``)
and grouped by expert, every expert's group padded to a multiple of ``BLOCK_M``::

    slots by expert:  [ e0: s3 s7 s1 -- | e2: s0 s4 -- -- | e5: s2 s5 s6 s8 ]   (-- = pad)
    block_expert:       0                 2                 5      (-1: unused block)

Kernel 1 (one program per block x ``BLOCK_N`` columns of I) multiplies the block's token
rows by its expert's gate and up rows of ``w13`` and stores ``silu(gate) * up`` per slot;
kernel 2 multiplies those by the expert's ``w2`` and the slot's routing weight. The slots
of one token are then summed (float32). Sorting is done with torch ops on the device, with
no host sync, so decode steps can be captured in CUDA graphs.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

__all__ = ["align_by_expert", "fused_moe"]


def align_by_expert(
    ids: torch.Tensor, num_experts: int, block_m: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """(slots int32 [num_blocks * block_m] padded with ``ids.numel()``, expert per block
    int32 [num_blocks], -1 for blocks past the last expert's group)."""
    flat = ids.flatten()
    num_slots = flat.numel()
    # scatter_add, not bincount: CUDA bincount reads the maximum back to the host (a sync
    # that CUDA graph capture forbids).
    counts = torch.zeros(num_experts, dtype=torch.int64, device=flat.device)
    counts.scatter_add_(0, flat, torch.ones_like(flat))
    padded = (counts + block_m - 1) // block_m * block_m
    ends = torch.cumsum(padded, 0)
    starts = ends - padded
    order = torch.argsort(flat, stable=True)
    sorted_experts = flat[order]
    first = torch.cumsum(counts, 0) - counts
    rank = torch.arange(num_slots, device=flat.device) - first[sorted_experts]
    dest = starts[sorted_experts] + rank
    # At most min(E, slots) groups can each waste block_m - 1 pad rows.
    max_len = triton.cdiv(num_slots + min(num_experts, num_slots) * (block_m - 1), block_m)
    slots = torch.full((max_len * block_m,), num_slots, dtype=torch.int32, device=flat.device)
    slots[dest] = order.to(torch.int32)
    block_starts = torch.arange(max_len, device=flat.device) * block_m
    block_expert = torch.searchsorted(ends, block_starts, right=True)
    block_expert = torch.where(block_expert < num_experts, block_expert, -1)
    return slots, block_expert.to(torch.int32)


@triton.jit
def _gate_up_kernel(
    x_ptr,
    w13_ptr,
    inter_ptr,
    slots_ptr,
    block_expert_ptr,
    num_slots,
    top_k,
    hidden,
    inter,
    stride_xt,
    stride_we,
    stride_wn,
    stride_it,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    DOT_PRECISION: tl.constexpr,
):
    pid_m = tl.program_id(0)
    pid_n = tl.program_id(1)
    expert = tl.load(block_expert_ptr + pid_m)
    if expert < 0:
        return
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    slots = tl.load(slots_ptr + offs_m)
    valid = slots < num_slots
    tokens = slots // top_k
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    n_ok = offs_n < inter
    w_base = w13_ptr + expert.to(tl.int64) * stride_we
    acc_gate = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
    acc_up = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
    for k0 in range(0, hidden, BLOCK_K):
        offs_k = k0 + tl.arange(0, BLOCK_K)
        k_ok = offs_k < hidden
        a = tl.load(
            x_ptr + tokens[:, None].to(tl.int64) * stride_xt + offs_k[None, :],
            mask=valid[:, None] & k_ok[None, :],
            other=0.0,
        )
        b_mask = k_ok[:, None] & n_ok[None, :]
        gate = tl.load(
            w_base + offs_n[None, :] * stride_wn + offs_k[:, None], mask=b_mask, other=0.0
        )
        up = tl.load(
            w_base + (offs_n[None, :] + inter) * stride_wn + offs_k[:, None],
            mask=b_mask,
            other=0.0,
        )
        acc_gate += tl.dot(a, gate, input_precision=DOT_PRECISION)
        acc_up += tl.dot(a, up, input_precision=DOT_PRECISION)
    hidden_act = acc_gate * tl.sigmoid(acc_gate) * acc_up
    tl.store(
        inter_ptr + slots[:, None].to(tl.int64) * stride_it + offs_n[None, :],
        hidden_act.to(inter_ptr.dtype.element_ty),
        mask=valid[:, None] & n_ok[None, :],
    )


@triton.jit
def _down_kernel(
    inter_ptr,
    w2_ptr,
    out_ptr,
    slots_ptr,
    block_expert_ptr,
    weights_ptr,
    num_slots,
    hidden,
    inter,
    stride_it,
    stride_we,
    stride_wn,
    stride_ot,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    DOT_PRECISION: tl.constexpr,
):
    pid_m = tl.program_id(0)
    pid_n = tl.program_id(1)
    expert = tl.load(block_expert_ptr + pid_m)
    if expert < 0:
        return
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    slots = tl.load(slots_ptr + offs_m)
    valid = slots < num_slots
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    n_ok = offs_n < hidden
    w_base = w2_ptr + expert.to(tl.int64) * stride_we
    acc = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
    for k0 in range(0, inter, BLOCK_K):
        offs_k = k0 + tl.arange(0, BLOCK_K)
        k_ok = offs_k < inter
        a = tl.load(
            inter_ptr + slots[:, None].to(tl.int64) * stride_it + offs_k[None, :],
            mask=valid[:, None] & k_ok[None, :],
            other=0.0,
        )
        b = tl.load(
            w_base + offs_n[None, :] * stride_wn + offs_k[:, None],
            mask=k_ok[:, None] & n_ok[None, :],
            other=0.0,
        )
        acc += tl.dot(a, b, input_precision=DOT_PRECISION)
    weight = tl.load(weights_ptr + slots, mask=valid, other=0.0)
    tl.store(
        out_ptr + slots[:, None].to(tl.int64) * stride_ot + offs_n[None, :],
        acc * weight[:, None],
        mask=valid[:, None] & n_ok[None, :],
    )


def _tile(size: int, cap: int = 64) -> int:
    return max(16, min(cap, int(triton.next_power_of_2(size))))


def fused_moe(
    x: torch.Tensor,
    w13: torch.Tensor,
    w2: torch.Tensor,
    weights: torch.Tensor,
    ids: torch.Tensor,
) -> torch.Tensor:
    """x [T, hidden], w13 [E, 2I, hidden], w2 [E, hidden, I], weights/ids [T, k] -> [T, hidden]."""
    num_tokens, hidden = x.shape
    num_experts, inter = w13.shape[0], w2.shape[-1]
    top_k = ids.shape[1]
    num_slots = num_tokens * top_k
    block_m = 16 if num_slots <= 64 else 64
    slots, block_expert = align_by_expert(ids, num_experts, block_m)
    num_blocks = block_expert.numel()
    x = x.contiguous()
    inter_buf = torch.empty(num_slots, inter, dtype=x.dtype, device=x.device)
    out = torch.empty(num_slots, hidden, dtype=torch.float32, device=x.device)
    precision = "ieee" if x.dtype == torch.float32 else "tf32"
    block_n, block_k = _tile(inter), _tile(hidden)
    _gate_up_kernel[(num_blocks, triton.cdiv(inter, block_n))](
        x,
        w13,
        inter_buf,
        slots,
        block_expert,
        num_slots,
        top_k,
        hidden,
        inter,
        x.stride(0),
        w13.stride(0),
        w13.stride(1),
        inter_buf.stride(0),
        BLOCK_M=block_m,
        BLOCK_N=block_n,
        BLOCK_K=block_k,
        DOT_PRECISION=precision,
    )
    block_n, block_k = _tile(hidden), _tile(inter)
    _down_kernel[(num_blocks, triton.cdiv(hidden, block_n))](
        inter_buf,
        w2,
        out,
        slots,
        block_expert,
        weights.reshape(-1).float().contiguous(),
        num_slots,
        hidden,
        inter,
        inter_buf.stride(0),
        w2.stride(0),
        w2.stride(1),
        out.stride(0),
        BLOCK_M=block_m,
        BLOCK_N=block_n,
        BLOCK_K=block_k,
        DOT_PRECISION=precision,
    )
    return out.view(num_tokens, top_k, hidden).sum(dim=1).to(x.dtype)
