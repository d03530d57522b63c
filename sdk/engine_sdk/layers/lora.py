"""Batched LoRA on ``Linear``: adapter slots on the device and each token's slot index.

Every ``Linear`` a LoRA adapter targets gets a :class:`LoRALayer` (``linear.lora``) from
the engine; ``Linear.forward`` then adds ``scaling * B[slot] @ A[slot] @ x`` per token, so
one batch mixes adapters and base requests and every model plugin built from ``Linear``
serves adapters without code of its own. The slots are fixed-size tensors (``num_slots``
adapters active at once, rank padded to ``max_rank``; the scaling ``alpha / r`` is folded
into ``B`` when an adapter is written into a slot)::

    lora_a  [num_slots, num_slices * max_rank, input_size]
    lora_b  [num_slots, output_size, max_rank]
    token_slots [max_num_tokens]  (LoRAContext, shared by all layers; -1 = no adapter)

A merged projection (q/k/v or gate/up run as one GEMM, ``merge_linears``) has one slice
per original projection: one shrink over the stacked ``A``s, then one expand over all
slices, each slice's columns from its own rank block of ``h`` (:class:`LoRASlices`)::

    h = x @ [A_q; A_k; A_v].T          y[:, q cols] += h[:, 0:R]   @ B[q rows].T
                                       y[:, k cols] += h[:, R:2R]  @ B[k rows].T ...

On CUDA the Triton kernels (``_lora_kernels``) run; elsewhere the torch reference, which
loops over the (few) slots with masks: no host sync, so it is also safe in a CUDA graph.
At decode the kernels' shrink splits ``K`` into parts (enough programs for the GPU) and
the expand adds them (``parts [P, T, S*R]`` float32, sum over ``P`` = ``h``): two launches
per projection, every size from the shapes. Where the projection itself runs as the
small-batch GEMV (``gemv``: a few decode rows, plain weights) the expand rides in the
GEMV's epilogue (``LoRALayer.epilogue``, ``Linear.forward``), and after an RMSNorm the
shrink normalizes its rows itself so the fused add+RMSNorm GEMV stays fused
(``Linear.lora_add_rms_norm``): one launch per projection for the adapters.
``ENGINE_LORA_KERNELS=0`` keeps CUDA on the reference, ``=force`` runs the kernels on the
CPU too (Triton's interpreter, for tests).
"""

from __future__ import annotations

import functools
import itertools
import os
from collections.abc import Sequence
from typing import TYPE_CHECKING

import torch

from engine_sdk.layers import lora_dense
from engine_sdk.layers.lora_dense import lora_apply_dense, use_dense
from engine_sdk.layers.lora_targets import lora_target_layers

if TYPE_CHECKING:
    from engine_sdk.layers.gemv import LoRAEpilogue

__all__ = [
    "LoRAContext",
    "LoRALayer",
    "LoRASlices",
    "lora_expand",
    "lora_expand_reference",
    "lora_shrink",
    "lora_shrink_reference",
    "lora_target_layers",
]


class LoRAContext:
    """What every LoRA layer of one model shares: the step's per-token slot indices.

    The runner writes ``token_slots[:num_tokens]`` before each forward (padding rows of a
    CUDA graph get -1); layers read the first ``x.shape[0]`` entries, a static view of one
    persistent buffer, which is what a captured graph replays.
    """

    def __init__(self, max_num_tokens: int, device: torch.device | str) -> None:
        self.token_slots = torch.full((max_num_tokens,), -1, dtype=torch.int32, device=device)
        # Host flag: whether this step has any adapter token (else layers skip LoRA). A
        # CUDA graph captured with it on runs the kernels, which skip slot -1 tokens.
        self.active = False


class LoRASlices:
    """The output slices of a merged projection: sizes on the host (the torch reference,
    the launch grid) and column starts on the device (the expand kernel reads them, so a
    CUDA graph replays a fixed tensor)::

        sizes (2048, 1024, 1024)  ->  starts [0, 2048, 3072, 4096] (int32)
    """

    def __init__(self, sizes: Sequence[int], device: torch.device | str) -> None:
        assert sizes and all(size > 0 for size in sizes)
        self.sizes = tuple(int(size) for size in sizes)
        starts = [0, *itertools.accumulate(self.sizes)]
        self.starts = torch.tensor(starts, dtype=torch.int32, device=device)

    @property
    def num_slices(self) -> int:
        return len(self.sizes)


class LoRALayer:
    """The adapter slots of one ``Linear`` (see the module docstring for the layout)."""

    def __init__(
        self,
        context: LoRAContext,
        num_slots: int,
        max_rank: int,
        input_size: int,
        slice_sizes: Sequence[int],
        dtype: torch.dtype,
        device: torch.device | str,
    ) -> None:
        self.context = context
        self.max_rank = max_rank
        self.slice_sizes = list(slice_sizes)
        num_slices, output_size = len(self.slice_sizes), sum(self.slice_sizes)
        self.lora_a = torch.zeros(
            num_slots, num_slices * max_rank, input_size, dtype=dtype, device=device
        )
        self.lora_b = torch.zeros(num_slots, output_size, max_rank, dtype=dtype, device=device)
        # B per slot transposed and block-diagonal over the slices, for many-token steps
        # (``lora_dense.block_bt``; kept in step with B), and the slots' one-hot rows
        self.lora_bt = lora_dense.block_bt(self.lora_b, self.slice_sizes)
        self.slot_onehot = lora_dense.slot_onehot(num_slots, dtype, device)
        self.slices = LoRASlices(self.slice_sizes, device)
        # The counters of the shrink inside the GEMV's launch (epilogue_in_gemv): zero
        # between launches, one pair per layer for the model's lifetime.
        self.gemv_flags = torch.zeros(2, dtype=torch.int32, device=device)

    @property
    def num_slots(self) -> int:
        return int(self.lora_a.shape[0])

    def set_slot(
        self, slot: int, weights: Sequence[tuple[torch.Tensor, torch.Tensor] | None]
    ) -> None:
        """Write one adapter into ``slot``: per slice ``(A [r, in], B [out, r])`` with the
        scaling already in ``B``, or ``None`` (the adapter leaves that slice alone).
        Copies on the device's stream: a step still running on the old slot contents
        finishes first (async scheduling stays correct)."""
        assert len(weights) == len(self.slice_sizes)
        self.lora_a[slot].zero_()
        self.lora_b[slot].zero_()
        offset = 0
        for i, (size, pair) in enumerate(zip(self.slice_sizes, weights, strict=True)):
            if pair is not None:
                a, b = pair
                rank = a.shape[0]
                assert rank <= self.max_rank and b.shape == (size, rank)
                rows = slice(i * self.max_rank, i * self.max_rank + rank)
                self.lora_a[slot, rows].copy_(a)
                self.lora_b[slot, offset : offset + size, :rank].copy_(b)
            offset += size
        lora_dense.fill_block_bt(self.lora_bt[slot], self.lora_b[slot], self.slice_sizes)

    def clear_slot(self, slot: int) -> None:
        self.lora_a[slot].zero_()
        self.lora_b[slot].zero_()
        self.lora_bt[slot].zero_()

    def fuses_into_gemv(self, x: torch.Tensor) -> bool:
        """Whether a GEMV over ``x`` (a few decode rows) may take this layer's expand into
        its epilogue (``epilogue``): adapters in the step and the Triton kernels on."""
        return self.context.active and _use_kernels(x)

    def epilogue(self, x: torch.Tensor) -> LoRAEpilogue:
        """The shrink of ``x`` [M, K] (one launch), and what a GEMV needs to add the
        expand in its epilogue: an adapter costs one launch instead of two."""
        slots = self.context.token_slots[: x.shape[0]]
        parts = lora_shrink_triton(x, self.lora_a, slots, blocked=False, parts=True)
        return self._epilogue(parts, slots)

    def epilogue_add_rms_norm(
        self, x: torch.Tensor, residual: torch.Tensor, norm_weight: torch.Tensor, eps: float
    ) -> LoRAEpilogue:
        """``epilogue`` for the fused add+RMSNorm GEMV (``gemv.gemv_add_rms_norm``): the
        shrink normalizes ``x + residual`` itself, as that GEMV does, so the norm, the
        shrink and the expand cost one launch beside the GEMV instead of three."""
        slots = self.context.token_slots[: x.shape[0]]
        parts = lora_shrink_add_rms_norm_triton(x, residual, norm_weight, eps, self.lora_a, slots)
        return self._epilogue(parts, slots)

    def epilogue_in_gemv(self, x: torch.Tensor) -> LoRAEpilogue:
        """``epilogue`` with the shrink inside the GEMV's own launch (``gemv.GemvShrink``):
        no launch for the adapter at all. The GEMV (plain or with the add+RMSNorm) runs
        it over its own input, so the same epilogue serves both."""
        from engine_sdk.layers.gemv import GemvShrink, LoRAEpilogue

        num_rows, k = x.shape
        rows = self.lora_a.shape[1]
        k_per_part = max(SHRINK_IN_GEMV_K, -(-k // (16 * 256)) * 256)  # at most 16 parts
        num_parts = -(-k // k_per_part)
        parts = torch.empty(num_parts, num_rows, rows, dtype=torch.float32, device=x.device)
        shrink = GemvShrink(self.lora_a, self.gemv_flags, -(-rows // 16), num_parts, k_per_part)
        slots = self.context.token_slots[:num_rows]
        return LoRAEpilogue(
            parts, self.lora_b, slots, self.slices.starts, self.slices.num_slices, shrink
        )

    def deferred_add_rms_norm(self, x: torch.Tensor) -> LoRAEpilogue:
        """What the fused add+RMSNorm GEMV needs to write this layer's shrink (over its
        normalized rows) from its own first programs and add no expand: the expand is left
        to the next kernel (``epilogue_silu_and_mul(gate_up_lora=...)``), so the adapter
        of a merged gate/up costs no launch and no GEMV epilogue
        (``ENGINE_LORA_EXPAND_IN_ACT=1``)."""
        return self.epilogue_in_gemv(x)._replace(expand=False)

    def epilogue_silu_and_mul(
        self, gate_up: torch.Tensor, gate_up_lora: LoRAEpilogue | None = None
    ) -> tuple[torch.Tensor, LoRAEpilogue]:
        """``silu(gate) * up`` of ``gate_up`` and ``epilogue`` of it, from one launch that
        computes the activation and the shrink together (the down projection); with
        ``gate_up_lora`` the gate/up adapter's deferred expand is added first."""
        slots = self.context.token_slots[: gate_up.shape[0]]
        act, parts = silu_and_mul_lora_shrink_triton(
            gate_up, self.lora_a, slots, gate_up_lora=gate_up_lora
        )
        return act, self._epilogue(parts, slots)

    def _epilogue(self, parts: torch.Tensor, slots: torch.Tensor) -> LoRAEpilogue:
        from engine_sdk.layers.gemv import LoRAEpilogue

        return LoRAEpilogue(parts, self.lora_b, slots, self.slices.starts, self.slices.num_slices)

    def apply(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        """``y`` (the base projection of ``x``) plus each token's adapter delta, in place."""
        if not self.context.active:
            return y
        x2 = x.reshape(-1, x.shape[-1])
        y = y if y.is_contiguous() else y.contiguous()
        y2 = y.view(-1, y.shape[-1])
        slots = self.context.token_slots[: x2.shape[0]]
        if use_dense(x2):  # 16+ tokens: every slot in two launches (lora_dense)
            lora_apply_dense(x2, y2, self.lora_a, self.lora_bt, slots, self.slot_onehot)
        elif _use_kernels(x2):  # two launches: the expand adds the shrink's K parts itself
            parts = lora_shrink_triton(x2, self.lora_a, slots, parts=True)
            lora_expand_triton(y2, parts, self.lora_b, slots, self.slices)
        else:
            h = lora_shrink_reference(x2, self.lora_a, slots)
            lora_expand_reference(y2, h, self.lora_b, slots, self.slices)
        return y


# -- the two batched products -----------------------------------------------------------------


@functools.lru_cache(maxsize=1)
def _kernels() -> object | None:
    """The Triton module, or None (not importable, or ``ENGINE_LORA_KERNELS=0``)."""
    if os.environ.get("ENGINE_LORA_KERNELS", "1") == "0":
        return None
    try:
        from engine_sdk.layers import _lora_kernels
    except ImportError:
        return None
    return _lora_kernels


@functools.lru_cache(maxsize=1)
def _forced() -> bool:
    """``ENGINE_LORA_KERNELS=force``: the Triton kernels on the CPU too (the interpreter)."""
    return os.environ.get("ENGINE_LORA_KERNELS") == "force"


# The shrink inside the GEMV's launch (``LoRALayer.epilogue_in_gemv``), instead of a
# launch before it: ``ENGINE_LORA_SHRINK_IN_GEMV=1``. Off by default: correct on an H100
# but slower (batch-1 decode with an adapter 2.39 ms against 1.55 with the shrink launch,
# 2026-12-06, docs/lora.md), its GEMV programs spinning on the shrink programs.
SHRINK_IN_GEMV_K = 512  # inputs of one shrink program (fewer programs past 16 parts)


def shrink_in_gemv() -> bool:
    return os.environ.get("ENGINE_LORA_SHRINK_IN_GEMV", "0") == "1"


# The gate/up adapter's shrink in the first programs of its own GEMV (no wait: nothing in
# that launch reads it) and its expand in the SiLU-and-mul kernel after it
# (``LoRALayer.deferred_add_rms_norm``). On by default since round 12 (H100, batch-1
# decode with an adapter: 1.599 ms against 1.681 with the gate/up expand in its GEMV's
# epilogue, one call); ``ENGINE_LORA_EXPAND_IN_ACT=0`` turns it off.
def expand_in_act() -> bool:
    return os.environ.get("ENGINE_LORA_EXPAND_IN_ACT", "1") == "1"


def _use_kernels(x: torch.Tensor) -> bool:
    return (x.is_cuda or _forced()) and _kernels() is not None


def lora_shrink(x: torch.Tensor, lora_a: torch.Tensor, slots: torch.Tensor) -> torch.Tensor:
    """``h[t] = x[t] @ lora_a[slots[t]].T`` in float32 (zero where ``slots[t] < 0``)."""
    if _use_kernels(x):
        return lora_shrink_triton(x, lora_a, slots)
    return lora_shrink_reference(x, lora_a, slots)


def lora_expand(
    y: torch.Tensor,
    h: torch.Tensor,
    lora_b: torch.Tensor,
    slots: torch.Tensor,
    slices: LoRASlices | None = None,
) -> None:
    """``y[t] += h[t] @ lora_b[slots[t]].T`` in place (nothing where ``slots[t] < 0``).

    With ``slices`` (``S`` of them), ``h`` holds ``S`` rank blocks of ``R = h.shape[1] / S``
    columns and slice ``i``'s columns of ``y`` take ``h[:, i*R:(i+1)*R] @ B[slice i rows].T``;
    ``None`` is one slice over all of ``y``'s columns."""
    if _use_kernels(y):
        lora_expand_triton(y, h, lora_b, slots, slices)
    else:
        lora_expand_reference(y, h, lora_b, slots, slices)


def lora_shrink_reference(
    x: torch.Tensor, lora_a: torch.Tensor, slots: torch.Tensor
) -> torch.Tensor:
    """The torch shrink: one masked GEMM per slot (few slots; no host sync)."""
    h = torch.zeros(x.shape[0], lora_a.shape[1], dtype=torch.float32, device=x.device)
    xf = x.float()
    for slot in range(lora_a.shape[0]):
        mask = (slots == slot).unsqueeze(1)
        h += torch.where(mask, xf @ lora_a[slot].float().T, 0.0)
    return h


def lora_expand_reference(
    y: torch.Tensor,
    h: torch.Tensor,
    lora_b: torch.Tensor,
    slots: torch.Tensor,
    slices: LoRASlices | None = None,
) -> None:
    """The torch expand (float32 sum, one rounding into ``y``'s dtype)."""
    sizes = slices.sizes if slices is not None else (y.shape[1],)
    rank = _slice_rank(y, h, lora_b, sizes)
    delta = torch.zeros(y.shape, dtype=torch.float32, device=y.device)
    for slot in range(lora_b.shape[0]):
        mask = (slots == slot).unsqueeze(1)
        b = lora_b[slot].float()
        offset = 0
        for i, size in enumerate(sizes):
            cols = slice(offset, offset + size)
            part = h[:, i * rank : (i + 1) * rank] @ b[cols].T
            delta[:, cols] += torch.where(mask, part, 0.0)
            offset += size
    y.copy_((y.float() + delta).to(y.dtype))


def _slice_rank(
    y: torch.Tensor, h: torch.Tensor, lora_b: torch.Tensor, sizes: Sequence[int]
) -> int:
    """The rank block of one slice in ``h``; checks that the shapes agree."""
    rank = h.shape[1] // len(sizes)
    assert rank * len(sizes) == h.shape[1] and rank == lora_b.shape[2], (h.shape, lora_b.shape)
    assert sum(sizes) == y.shape[1] == lora_b.shape[1], (sizes, y.shape, lora_b.shape)
    return rank


def _block(n: int, least: int = 16) -> int:
    return max(least, 1 << (max(n, 1) - 1).bit_length())


# From this many tokens (prefill chunks) the blocked kernels run: BLOCK_M tokens per
# program read each slot's weights once; below it (decode) the per-token kernels, whose
# shrink splits K into parts to keep every SM busy. ``blocked=None`` picks by this
# threshold (tests force either).
BLOCKED_MIN_TOKENS = 128
BLOCKED_MAX_PARTS = 16  # the blocked shrink's K parts at most (the blocked expand's BLOCK_P)
# The per-token expand's BLOCK_P at least: the parts of every split from 5 tokens up (at
# most 132 SMs / 5), so one compiled expand serves them all; more only for long K at 1-4
# tokens (the decode graphs' sizes, compiled when they are captured).
PER_TOKEN_BLOCK_P = 32
_BLOCK_M = 16
# the per-token shrink: rank rows and K columns of one program's tile
_SHRINK_BLOCK_R = 16
_SHRINK_BLOCK_K = 128
_BLOCKED_BLOCK_K = 64  # the blocked shrink's K step


def _dot_precision(dtype: torch.dtype) -> str | None:
    return "ieee" if dtype == torch.float32 else None  # fp32: no tf32 rounding


def _shrink_split(
    num_tokens: int, k: int, r: int, device: torch.device, num_parts: int | None = None
) -> tuple[int, int, int]:
    """``(parts, BLOCK_K, K per part)`` of the per-token shrink: about one program per
    multiprocessor (``num_tokens * cdiv(r, 16)`` programs per part), at most one part per
    ``BLOCK_K`` step of ``K``, no part empty; ``num_parts`` asks for a count (tests)::

        1 token, K 3072, r 16, 132 SMs  ->  24 parts of 128      64 tokens, r 48  ->  1 part
    """
    block_k = min(_block(k, 32), _SHRINK_BLOCK_K)
    programs = num_tokens * -(-r // _SHRINK_BLOCK_R)
    parts, k_per_part = _k_parts(programs, k, block_k, device, num_parts)
    return parts, block_k, k_per_part


def _blocked_split(
    num_tokens: int, k: int, device: torch.device, num_parts: int | None = None
) -> tuple[int, int]:
    """``(parts, K per part)`` of the blocked shrink: its ``cdiv(T, BLOCK_M)`` token blocks
    are few at decode batches (256 tokens: 16 programs), so K is split too, to about one
    program per multiprocessor; a long prefill chunk keeps one part::

        256 tokens, K 1024, 132 SMs  ->  8 parts of 128      8192 tokens  ->  1 part

    At most ``BLOCKED_MAX_PARTS``, the expand's fixed ``BLOCK_P``: one compiled expand for
    every token count (round 11 on an H100: a step of a new size compiled new variants,
    about 0.85 s inside a W1 run)."""
    programs = -(-num_tokens // _BLOCK_M)
    return _k_parts(programs, k, _BLOCKED_BLOCK_K, device, num_parts, BLOCKED_MAX_PARTS)


def _k_parts(
    programs: int,
    k: int,
    block_k: int,
    device: torch.device,
    num_parts: int | None,
    max_parts: int | None = None,
) -> tuple[int, int]:
    """Split K (``cdiv(k, block_k)`` steps) into about ``SMs / programs`` parts (at most
    ``max_parts``), or ``num_parts``: ``(parts, K per part)``, a whole number of steps
    each, none empty."""
    from engine_sdk.layers import split_k

    if num_parts is None:
        num_parts = -(-split_k.num_multiprocessors(device) // max(programs, 1))
        num_parts = num_parts if max_parts is None else min(max_parts, num_parts)
    parts, steps_per_part = split_k.pick_split(1, -(-k // block_k), num_parts)
    return parts, steps_per_part * block_k


def lora_shrink_triton(
    x: torch.Tensor,
    lora_a: torch.Tensor,
    slots: torch.Tensor,
    blocked: bool | None = None,
    *,
    parts: bool = False,
    num_parts: int | None = None,
) -> torch.Tensor:
    """``h[t] = x[t] @ lora_a[slots[t]].T`` (float32) through the kernels.

    ``parts=True`` returns the partial products ``[P, T, R]`` instead, whose sum over ``P``
    is ``h``: what :func:`lora_expand_triton` takes, adding them as it reads ``h`` (no
    reduce launch). The count is ``_blocked_split``'s (blocked kernel) or
    ``_shrink_split``'s (per-token kernel), or ``num_parts`` (at most one per ``BLOCK_K``
    step of K)."""
    from engine_sdk.layers._lora_kernels import lora_shrink_blocked_kernel, lora_shrink_kernel

    assert x.stride(-1) == 1 and lora_a.stride(-1) == 1
    num_tokens, k = x.shape
    r = lora_a.shape[1]
    if blocked if blocked is not None else num_tokens >= BLOCKED_MIN_TOKENS:
        split, k_per_part = _blocked_split(num_tokens, k, x.device, num_parts)
        # empty, not zeros: the kernels write every row (zeros for slot -1), one launch less
        out = torch.empty(split, num_tokens, r, dtype=torch.float32, device=x.device)
        if num_tokens > 0:
            lora_shrink_blocked_kernel[(-(-num_tokens // _BLOCK_M), split)](
                x, lora_a, out, slots,
                num_tokens, k, r, k_per_part,
                x.stride(0), lora_a.stride(0), lora_a.stride(1), out.stride(0), out.stride(1),
                NUM_SLOTS=lora_a.shape[0], BLOCK_M=_BLOCK_M, BLOCK_R=_block(r),
                BLOCK_K=_BLOCKED_BLOCK_K, DOT_PRECISION=_dot_precision(x.dtype),
            )  # fmt: skip
        return _parts_or_sum(out, parts)
    split, block_k, k_per_part = _shrink_split(num_tokens, k, r, x.device, num_parts)
    out = torch.empty(split, num_tokens, r, dtype=torch.float32, device=x.device)
    if num_tokens > 0:
        lora_shrink_kernel[(num_tokens, -(-r // _SHRINK_BLOCK_R), split)](
            x, lora_a, out, slots,
            k, r, k_per_part,
            x.stride(0), lora_a.stride(0), lora_a.stride(1), out.stride(0), out.stride(1),
            BLOCK_R=_SHRINK_BLOCK_R, BLOCK_K=block_k,
        )  # fmt: skip
    return _parts_or_sum(out, parts)


def lora_shrink_add_rms_norm_triton(
    x: torch.Tensor,
    residual: torch.Tensor,
    norm_weight: torch.Tensor,
    eps: float,
    lora_a: torch.Tensor,
    slots: torch.Tensor,
    num_parts: int | None = None,
) -> torch.Tensor:
    """The per-token shrink's parts ``[P, T, R]`` of ``rms_norm(x + residual) *
    norm_weight`` (the roundings of ``gemv.gemv_add_rms_norm``), split as
    ``_shrink_split`` picks; ``x`` and ``residual`` are left as they are."""
    from engine_sdk.layers._lora_kernels import lora_shrink_add_rms_norm_kernel

    assert x.stride(-1) == 1 and residual.stride(-1) == 1 and lora_a.stride(-1) == 1
    num_tokens, k = x.shape
    r = lora_a.shape[1]
    split, block_k, k_per_part = _shrink_split(num_tokens, k, r, x.device, num_parts)
    out = torch.empty(split, num_tokens, r, dtype=torch.float32, device=x.device)
    if num_tokens > 0:
        lora_shrink_add_rms_norm_kernel[(num_tokens, -(-r // _SHRINK_BLOCK_R), split)](
            x, residual, norm_weight, lora_a, out, slots,
            k, r, k_per_part, eps,
            x.stride(0), residual.stride(0), lora_a.stride(0), lora_a.stride(1),
            out.stride(0), out.stride(1),
            BLOCK_R=_SHRINK_BLOCK_R, BLOCK_K=block_k, ROW_P=_block(k),
        )  # fmt: skip
    return out


def silu_and_mul_lora_shrink_triton(
    gate_up: torch.Tensor,
    lora_a: torch.Tensor,
    slots: torch.Tensor,
    num_parts: int | None = None,
    gate_up_lora: LoRAEpilogue | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """``(silu(gate) * up, parts)`` of ``gate_up`` [T, 2 * inter] in one launch: the
    activation (as ``fused_ops.silu_and_mul_merged`` gives it) and the per-token shrink's
    parts ``[P, T, R]`` of that activation with ``lora_a`` [slots, R, inter].

    ``gate_up_lora``: the gate/up projection's own expand, not yet added to ``gate_up``
    (its shrink's parts ``[P', T, 2R]`` and ``B [slots, 2 * inter, R]``,
    ``LoRALayer.deferred_add_rms_norm``): added first, rounded as ``lora_expand`` rounds."""
    from engine_sdk.layers._lora_kernels import silu_mul_lora_shrink_kernel

    assert gate_up.stride(-1) == 1 and lora_a.stride(-1) == 1
    num_tokens, inter = gate_up.shape[0], gate_up.shape[1] // 2
    r = lora_a.shape[1]
    block_r = _block(r)
    block_k = min(256, max(32, 4096 // block_r), _block(inter, 32))
    split, k_per_part = _k_parts(num_tokens, inter, block_k, gate_up.device, num_parts)
    act = torch.empty(num_tokens, inter, dtype=gate_up.dtype, device=gate_up.device)
    out = torch.empty(split, num_tokens, r, dtype=torch.float32, device=gate_up.device)
    gu: tuple[object, ...] = (out, lora_a, 1, 0, 0, 0, 0)  # never read without GU_EXPAND
    block_gp = 1
    if gate_up_lora is not None:
        gp, gb = gate_up_lora.parts, gate_up_lora.lora_b
        assert gate_up_lora.num_slices == 2 and gb.shape[1] == 2 * inter and gb.shape[2] == r
        assert gp.shape[2] == 2 * r and gp.stride(-1) == 1 and gb.stride(-1) == 1
        gu = (gp, gb, gp.shape[0], gp.stride(0), gp.stride(1), gb.stride(0), gb.stride(1))
        block_gp = _block(gp.shape[0], 1)
    if num_tokens > 0:
        silu_mul_lora_shrink_kernel[(num_tokens, split)](
            gate_up, act, lora_a, out, slots,
            inter, r, k_per_part,
            gate_up.stride(0), act.stride(0), lora_a.stride(0), lora_a.stride(1),
            out.stride(0), out.stride(1), *gu,
            BLOCK_R=block_r, BLOCK_K=block_k, GU_EXPAND=gate_up_lora is not None,
            BLOCK_GP=block_gp,
        )  # fmt: skip
    return act, out


def _parts_or_sum(out: torch.Tensor, parts: bool) -> torch.Tensor:
    if parts:
        return out
    return out[0] if out.shape[0] == 1 else out.sum(0)


def lora_expand_triton(
    y: torch.Tensor,
    h: torch.Tensor,
    lora_b: torch.Tensor,
    slots: torch.Tensor,
    slices: LoRASlices | None = None,
    blocked: bool | None = None,
) -> None:
    """One launch over every slice (see ``_lora_kernels``): the column tiles of all slices
    in the grid's second axis, each program finding its slice from ``slices.starts``.
    ``h`` is ``[T, S*R]`` or the shrink's parts ``[P, T, S*R]`` (summed over ``P``)."""
    from engine_sdk.layers._lora_kernels import lora_expand_blocked_kernel, lora_expand_kernel

    parts = h if h.dim() == 3 else h.unsqueeze(0)
    assert y.stride(-1) == 1 and parts.stride(-1) == 1 and lora_b.stride(-1) == 1
    num_tokens, n = y.shape
    sizes = slices.sizes if slices is not None else (n,)
    r = _slice_rank(y, parts[0], lora_b, sizes)
    if num_tokens == 0:
        return
    block_n = min(_block(max(sizes), 32), 128)
    num_tiles = sum(-(-size // block_n) for size in sizes)
    # one slice: the kernel never reads the starts (any pointer does)
    starts = slices.starts if slices is not None and len(sizes) > 1 else slots
    if blocked if blocked is not None else num_tokens >= BLOCKED_MIN_TOKENS:
        lora_expand_blocked_kernel[(-(-num_tokens // _BLOCK_M), num_tiles)](
            parts, lora_b, y, slots, starts,
            num_tokens, n, r, parts.shape[0],
            parts.stride(0), parts.stride(1), lora_b.stride(0), lora_b.stride(1), y.stride(0),
            NUM_SLOTS=lora_b.shape[0], NUM_SLICES=len(sizes), BLOCK_M=_BLOCK_M,
            BLOCK_N=block_n, BLOCK_R=_block(r), DOT_PRECISION=_dot_precision(lora_b.dtype),
            BLOCK_P=max(BLOCKED_MAX_PARTS, _block(parts.shape[0], 1)),
        )  # fmt: skip
        return
    num_parts = parts.shape[0]
    lora_expand_kernel[(num_tokens, num_tiles)](
        parts, lora_b, y, slots, starts,
        n, r, num_parts,
        parts.stride(0), parts.stride(1), lora_b.stride(0), lora_b.stride(1), y.stride(0),
        NUM_SLICES=len(sizes), BLOCK_N=block_n, BLOCK_R=_block(r),
        BLOCK_P=max(PER_TOKEN_BLOCK_P, _block(num_parts, 1)),
    )  # fmt: skip
