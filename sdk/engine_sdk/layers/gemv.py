"""Small-batch GEMM as a Triton GEMV: ``x @ W.T (+ b)`` for at most ``MAX_ROWS`` rows.

At one to a few activation rows a projection reads its whole weight to do almost no
arithmetic, so its speed is the weight read. cuBLAS picks tiles made for larger batches
and reached about a quarter of the H200's copy bandwidth on the Qwen3-0.6B projections
(docs/performance.md). This kernel gives each program ``BLOCK_N`` weight rows read in
``BLOCK_K`` chunks, enough programs to keep every multiprocessor loading, and reuses each
loaded tile for all activation rows::

    program p:  rows p*BLOCK_N .. +BLOCK_N of W [N, K]  x  x [M, K]  ->  out[:, those rows]

``use_gemv`` decides per call (CUDA, bf16/fp16, contiguous weight, ``prefer_gemv`` for
the shape, ``ENGINE_GEMV`` not ``0``); ``ENGINE_GEMV=force`` also runs it on the CPU
through Triton's interpreter (tests). The tile sizes come from ``pick_tiles``.

``gemv_add_rms_norm`` takes the decoder's residual add and RMSNorm into its loads: the
projection after a norm (q/k/v, gate/up) reads the block output and the residual, and
returns the new residual too (``use_gemv_add_rms_norm``: rows of at most ``NORM_MAX_K``
elements). One launch less per norm; on the H200 the fused kernel also took less time
than the two it replaces (0.6B q/k/v 5.7 -> 4.1 us, gate/up 7.2 -> 5.3; 8B q/k/v
16.5 -> 14.4, gate/up 57.6 -> 55.3). The same idea for SiLU-and-multiply in the down
projection lost (0.6B 5.5 -> 6.4 us, 8B 33.7 -> 44.4: every program recomputes the
activation over the whole intermediate row), so the down projection keeps it out. It
goes the other way instead: ``gemv_add_rms_norm(gated=True)`` gives each program its gate
rows and the matching up rows of the merged weight, so SiLU-and-multiply is an epilogue of
values the program already holds (no recomputation) and the decoder's batch-1 MLP is two
launches (``decoder._norm_gate_up_silu``; ``ENGINE_FUSED_SILU=0`` off). W2 on an H100
(2026-12-06, docs/performance.md "Round 10"): 1.03-1.06 ms a token with it, 1.10 without.

Float8 weights (``scale``, ``weight_scale_mode``): the same kernels read an e4m3 weight
with one float32 scale or one per output row and apply it to the float32 sum, so a
weight-only FP8 projection at one row is the bf16 launch reading half the bytes, the add +
RMSNorm and the gated SiLU included (``engine_fp8`` routes its tensor and channel layouts
here; block scales keep its split-K kernel). ``FP8_BLOCK_N`` (``ENGINE_GEMV_FP8_BLOCK_N``)
and ``FP8_GATED_BLOCK_N`` set the rows per program of the launches for float8 weights
(twice bf16's, the same bytes a program).

Measured on an H200 (``benchmarks/decode_kernels_gpu.py --sweep``, 2026-12-04, weights
read from HBM, inside CUDA graphs), microseconds, cuBLAS -> this kernel:

    one row:    Qwen3-0.6B qkv 5.2 -> 4.1, o 12.6 -> 3.2, gate_up 5.9 -> 5.0, down 7.6 -> 4.1;
                Llama-8B qkv 15.3 -> 13.9, o 13.4 -> 10.1, down 32.2 -> 29.3, gate_up equal
    four rows:  cuBLAS wins where N >= K or the weight is large; this kernel where N < K on
                small weights (0.6B o 11.7 -> 4.5, down 7.8 -> 6.7)
"""

from __future__ import annotations

import functools
import os
from typing import NamedTuple

import torch

__all__ = [
    "MAX_ROWS",
    "GemvShrink",
    "LoRAEpilogue",
    "NORM_MAX_K",
    "gemv",
    "gemv_add_rms_norm",
    "pick_tiles",
    "prefer_gemv",
    "use_gemv",
    "use_gemv_add_rms_norm",
    "weight_scale_mode",
]

MAX_ROWS = 4  # rows at or below which the GEMV may replace the library GEMM
SMALL_WEIGHT_BYTES = 16 * 2**20  # above this, cuBLAS keeps 2..MAX_ROWS rows
NORM_MAX_K = 4096  # gemv_add_rms_norm holds a whole row in one tile
# gate (and as many up) rows per program of the gated gemv_add_rms_norm: two weight rows a
# program, as the plain kernel's measured best; ENGINE_GATED_BLOCK_N for sweeps
GATED_BLOCK_N = int(os.environ.get("ENGINE_GATED_BLOCK_N", "1"))
# Weight rows per program of a GEMV with the LoRA epilogue (adapter steps). Each program's
# epilogue loads and sums the shrink's parts of its slices: fewer, wider programs load them
# fewer times (round 11: the epilogue added 1-2 us to each GEMV). Default: the plain
# kernel's 2, until a sweep (ENGINE_LORA_GEMV_BLOCK_N, a power of two) measures better.
LORA_BLOCK_N = int(os.environ.get("ENGINE_LORA_GEMV_BLOCK_N", "2"))
# Weight rows per program for float8 weights: twice bf16's, so that a program reads as
# many bytes as bf16's measured best. Plain and add+RMSNorm launches 4 (bf16 2), the gated
# launch 2 gate rows and as many up rows (bf16 1). H100, 2026-12-07 (rows_gemv_gpu.py,
# Qwen3-0.6B at one token): q/k/v with the norm 4.19 -> 3.91 us, gate/up gated 5.70 ->
# 4.74, o and down within 2% either way (also on the Llama-8B shape); W2 with 4 rows a
# program 0.95x bf16's in the same call. ENGINE_GEMV_FP8_BLOCK_N / _GATED_BLOCK_N: sweeps.
FP8_BLOCK_N = int(os.environ.get("ENGINE_GEMV_FP8_BLOCK_N", "4"))
FP8_GATED_BLOCK_N = int(os.environ.get("ENGINE_GEMV_FP8_GATED_BLOCK_N", "2"))
# Pipeline stages of the plain kernel's K loop (gemv_kernel's STAGES; 0: the plain loop).
# Off: 2 stages were 1-4% slower at W2 8B on an H100 (round 19); ENGINE_GEMV_LOOP_STAGES for sweeps.
LOOP_STAGES = int(os.environ.get("ENGINE_GEMV_LOOP_STAGES", "0"))
# The kernels' LoRA constexprs without an adapter, and the shrink's K step: named at every
# launch, defaults included, as torch.compile needs (engine_sdk.testing.launches).
SHRINK_K = 256
NO_LORA: dict[str, object] = {
    "LORA": False, "NUM_SLICES": 1, "BLOCK_R": 16, "BLOCK_P": 1, "SHRINK": False,
    "SHRINK_K": SHRINK_K,
}  # fmt: skip
_DTYPES = (torch.bfloat16, torch.float16)


@functools.lru_cache(maxsize=1)
def _kernel() -> object | None:
    try:
        from engine_sdk.layers._gemv_kernels import gemv_kernel
    except ImportError:
        return None
    kernel: object = gemv_kernel
    return kernel


def _norm_kernel() -> object:
    from engine_sdk.layers._gemv_kernels import gemv_add_rms_norm_kernel

    kernel: object = gemv_add_rms_norm_kernel
    return kernel


def use_gemv(x: torch.Tensor, weight: torch.Tensor, scale: torch.Tensor | None = None) -> bool:
    """Whether ``gemv`` runs for this call (see the module docstring); ``scale`` with a
    float8 ``weight`` (``weight_scale_mode``)."""
    # Shape first: most calls (prefill, large batches) stop here without an environ lookup.
    if x.dim() != 2 or weight.dim() != 2 or x.shape[0] > MAX_ROWS:
        return False
    return _runs(x, weight, scale)


def use_gemv_add_rms_norm(
    x: torch.Tensor,
    residual: torch.Tensor,
    weight: torch.Tensor,
    scale: torch.Tensor | None = None,
) -> bool:
    """Whether ``gemv_add_rms_norm`` runs for block output ``x`` and ``residual`` [M, K]."""
    if x.dim() != 2 or weight.dim() != 2 or x.shape[0] > MAX_ROWS:
        return False
    if x.shape[1] > NORM_MAX_K or residual.shape != x.shape or residual.stride(1) != 1:
        return False
    return weight.shape[1] == x.shape[1] and residual.dtype == x.dtype and _runs(x, weight, scale)


def weight_scale_mode(weight: torch.Tensor, scale: torch.Tensor | None) -> int | None:
    """The kernels' ``SCALE`` for ``weight`` and its ``scale``: 0 (a bf16/fp16 weight, no
    scale), 1 (float8 e4m3, one float32 scale), 2 (float8 e4m3, a float32 scale per output
    row, ``[N]`` or ``[N, 1]``, contiguous); None for anything else (block scales, other
    float8 formats: the caller's own kernel)."""
    if scale is None:
        return 0 if weight.dtype in _DTYPES else None
    if weight.dtype != torch.float8_e4m3fn or scale.dtype != torch.float32:
        return None
    if scale.numel() == 1:
        return 1
    if scale.numel() == weight.shape[0] and scale.is_contiguous():
        return 2
    return None


def _weight_fits(x: torch.Tensor, weight: torch.Tensor, scale: torch.Tensor | None) -> bool:
    mode = weight_scale_mode(weight, scale)
    return mode is not None and (mode > 0 or weight.dtype == x.dtype)


def _runs(x: torch.Tensor, weight: torch.Tensor, scale: torch.Tensor | None = None) -> bool:
    """The checks after the shape: switch, measured preference, device, dtypes, strides."""
    mode = os.environ.get("ENGINE_GEMV", "1")
    if mode == "0":
        return False
    if not prefer_gemv(x.shape[0], weight.shape[0], weight.shape[1], weight.element_size()):
        return False
    if not x.is_cuda and mode != "force":
        return False
    return (
        x.dtype in _DTYPES
        and _weight_fits(x, weight, scale)
        and weight.stride(1) == 1
        and x.stride(1) == 1
        and _kernel() is not None
    )


class GemvShrink(NamedTuple):
    """A LoRA shrink inside the GEMV's own launch (``lora.LoRALayer.epilogue_in_gemv``):
    its first ``num_rank_blocks * num_parts`` programs write the shrink into the
    epilogue's ``parts`` (16 rank rows and ``k_per_part`` inputs each) while the others
    read their weights, and wait for them only before the epilogue. ``flags`` (int32
    ``[2]``, the layer's own) are zero between launches."""

    lora_a: torch.Tensor  # [slots, S*R, K]
    flags: torch.Tensor
    num_rank_blocks: int
    num_parts: int
    k_per_part: int

    @property
    def num_programs(self) -> int:
        return self.num_rank_blocks * self.num_parts


class LoRAEpilogue(NamedTuple):
    """A LoRA expand for a GEMV's epilogue: ``out[m, n] += h[m, slice(n)] @ B[slot_m, n]``
    in float32 before the one rounding, so an adapter costs the shrink's launch only
    (``lora.LoRALayer.epilogue``). ``parts`` are the shrink's partial products
    ``[P, M, S*R]`` (their sum over ``P`` is ``h``), ``lora_b`` is ``[slots, N, R]``,
    ``slots`` each row's slot (-1: none), ``starts`` the ``S + 1`` slice starts."""

    parts: torch.Tensor
    lora_b: torch.Tensor
    slots: torch.Tensor
    starts: torch.Tensor
    num_slices: int
    shrink: GemvShrink | None = None  # None: the shrink ran before (``parts`` hold it)
    # False (with ``shrink``): the GEMV only writes the shrink's parts; a later kernel adds
    # the expand (``lora.LoRALayer.deferred_add_rms_norm``)
    expand: bool = True

    def args(self) -> tuple[object, ...]:
        """The kernels' LoRA arguments, in their order."""
        parts, b, shrink = self.parts, self.lora_b, self.shrink
        shrink_args: tuple[object, ...] = (parts, parts, 0, 1, 0, 0, 0)
        if shrink is not None:
            a = shrink.lora_a
            shrink_args = (
                a, shrink.flags, shrink.num_programs, shrink.num_rank_blocks,
                shrink.k_per_part, a.stride(0), a.stride(1),
            )  # fmt: skip
        return (
            parts, b, self.slots, self.starts, b.shape[2], parts.shape[0],
            parts.stride(0), parts.stride(1), b.stride(0), b.stride(1), *shrink_args,
        )  # fmt: skip

    @property
    def extra_programs(self) -> int:
        return 0 if self.shrink is None else self.shrink.num_programs

    def constants(self) -> dict[str, object]:
        rank = self.lora_b.shape[2]
        return {
            **NO_LORA,  # the same constexprs, each named (SHRINK_K as without an adapter)
            "LORA": self.expand,
            "NUM_SLICES": self.num_slices,
            "BLOCK_R": max(16, 1 << (rank - 1).bit_length()),
            "BLOCK_P": 1 << (self.parts.shape[0] - 1).bit_length(),
            "SHRINK": self.shrink is not None,
        }


def _lora_args(
    lora: LoRAEpilogue | None, weight: torch.Tensor
) -> tuple[tuple[object, ...], dict[str, object]]:
    assert lora is None or lora.expand or lora.shrink is not None, "no shrink, no expand"
    if lora is None:  # the pointers are never read (LORA off): any tensor does
        args = (weight, weight, weight, weight, 0, 0, 0, 0, 0, 0, weight, weight, 0, 1, 0, 0, 0)
        return args, NO_LORA
    assert lora.parts.stride(-1) == 1 and lora.lora_b.stride(-1) == 1
    return lora.args(), lora.constants()


def prefer_gemv(rows: int, n: int, k: int, element_size: int = 2) -> bool:
    """Whether this kernel beats cuBLAS for ``rows`` x ``[n, k]`` (the measurements above):
    always at one row; at 2..``MAX_ROWS`` rows only for a small weight with ``n < k``."""
    if rows == 1:
        return True
    return 1 < rows <= MAX_ROWS and n < k and n * k * element_size <= SMALL_WEIGHT_BYTES


def pick_tiles(n: int, k: int) -> tuple[int, int, int]:
    """``(BLOCK_N, BLOCK_K, num_warps)``: two weight rows per program, read in K chunks of
    2048 (all of a smaller K), four warps: the best or within 10% of the best tile in the
    sweep for every measured shape at one row."""
    return 2, min(2048, max(16, 1 << (k - 1).bit_length())), 4


def gemv(
    x: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None = None,
    tiles: tuple[int, int, int] | None = None,
    lora: LoRAEpilogue | None = None,
    out_dtype: torch.dtype | None = None,
    scale: torch.Tensor | None = None,
) -> torch.Tensor:
    """``x @ weight.T + bias`` for ``x`` [M, K] (M at most ``MAX_ROWS``), ``weight`` [N, K];
    plus each row's adapter delta with ``lora``. ``out_dtype`` (float32 for logits) holds
    the result rounded to ``x``'s dtype, without a second launch to widen it. ``scale``:
    ``weight`` is float8 e4m3 and ``x @ (weight * scale).T`` is computed, the scale (one,
    or one per output row, float32) applied to the float32 sum (``weight_scale_mode``)."""
    from engine_sdk.layers.pdl import pdl_launch

    kernel = _kernel()
    assert kernel is not None
    assert lora is None or lora.expand, "a deferred expand needs the add+RMSNorm GEMV"
    scale_mode = _scale_mode(weight, scale, lora)
    num_rows = x.shape[0]
    n, k = weight.shape
    out = torch.empty(num_rows, n, dtype=out_dtype or x.dtype, device=x.device)
    block_n, block_k, warps = tiles or pick_tiles(n, k)
    if lora is not None and tiles is None:
        block_n = LORA_BLOCK_N
    elif scale_mode and tiles is None:
        block_n = FP8_BLOCK_N
    block_m = max(1, 1 << (num_rows - 1).bit_length())
    lora_args, lora_constants = _lora_args(lora, weight)
    extra = 0 if lora is None else lora.extra_programs
    kernel[(-(-n // block_n) + extra,)](  # type: ignore[index]
        x, weight, bias if bias is not None else weight, scale if scale is not None else weight,
        out, num_rows, n, k, x.stride(0), weight.stride(0), out.stride(0), *lora_args,
        HAS_BIAS=bias is not None, BLOCK_M=block_m, BLOCK_N=block_n, BLOCK_K=block_k,
        num_warps=warps, SCALE=scale_mode, STAGES=LOOP_STAGES, **lora_constants,
        **pdl_launch(x, prefetch=lora is None),
    )  # fmt: skip
    return out


def _scale_mode(weight: torch.Tensor, scale: torch.Tensor | None, lora: object) -> int:
    mode = weight_scale_mode(weight, scale)
    assert mode is not None, "a bf16/fp16 weight, or float8 e4m3 with a tensor/row scale"
    assert mode == 0 or lora is None, "a scaled (float8) weight has no LoRA epilogue"
    return mode


def gemv_add_rms_norm(
    x: torch.Tensor,
    residual: torch.Tensor,
    norm_weight: torch.Tensor,
    eps: float,
    weight: torch.Tensor,
    bias: torch.Tensor | None = None,
    lora: LoRAEpilogue | None = None,
    gated: bool = False,
    scale: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """``(rms_norm(x + residual) * norm_weight) @ weight.T + bias`` and ``x + residual``
    (the new residual), for ``x`` and ``residual`` [M, K] with K at most ``NORM_MAX_K``;
    equal to ``add_rms_norm`` then ``gemv`` (with ``lora``: plus each row's adapter
    delta, the shrink taken over the normalized rows, ``lora.lora_shrink_add_rms_norm``).

    ``gated`` (no ``lora``): ``weight`` is a merged ``[gate | up]`` of ``2 * I`` rows and
    the output is ``silu(gate) * up`` [M, I], as ``silu_and_mul_merged`` of the plain
    output: one launch for the norm, the gate/up projection and the activation. Each
    program reads ``GATED_BLOCK_N`` gate rows and as many up rows. ``scale``: a float8
    ``weight``, as in ``gemv`` (gated: the merged weight's ``2 * I`` row scales)."""
    from engine_sdk.layers.pdl import pdl_launch

    assert not (gated and lora is not None), "the gated GEMV has no LoRA epilogue"
    scale_mode = _scale_mode(weight, scale, lora)
    num_rows, k = x.shape
    n = weight.shape[0] // 2 if gated else weight.shape[0]
    out = torch.empty(num_rows, n, dtype=x.dtype, device=x.device)
    new_residual = torch.empty(num_rows, k, dtype=x.dtype, device=x.device)
    block_k = max(16, 1 << (k - 1).bit_length())
    block_m = max(1, 1 << (num_rows - 1).bit_length())
    block_n = GATED_BLOCK_N if gated else LORA_BLOCK_N if lora is not None else 2
    if scale_mode:
        block_n = FP8_GATED_BLOCK_N if gated else FP8_BLOCK_N
    lora_args, lora_constants = _lora_args(lora, weight)
    extra = 0 if lora is None else lora.extra_programs
    _norm_kernel()[(-(-n // block_n) + extra,)](  # type: ignore[index]
        x, residual, norm_weight, weight, bias if bias is not None else weight,
        scale if scale is not None else weight, out, new_residual, num_rows, n, k, eps,
        x.stride(0), residual.stride(0), weight.stride(0), out.stride(0), new_residual.stride(0),
        *lora_args,
        HAS_BIAS=bias is not None, BLOCK_M=block_m, BLOCK_N=block_n, BLOCK_K=block_k,
        num_warps=4 if block_k <= 2048 else 8, GATED=gated, SCALE=scale_mode, **lora_constants,
        **pdl_launch(x, prefetch=lora is None),
    )  # fmt: skip
    return out, new_residual
