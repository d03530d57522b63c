"""Split-K for small-batch GEMM kernels: how many parts to split K into, and how the parts
are added.

A decode GEMM (a few activation rows) has few output tiles, too few programs to keep every
multiprocessor reading weights. Splitting the reduction dimension K into ``S`` parts gives
``S`` times the programs; each writes its partial product to ``partials[s]`` in float32.
Two ways to add them, both deterministic (the parts are always added in the order
``s = 0 .. S-1``, whatever order the programs finish in):

- a second launch, :func:`reduce_split_k` (the W4A16 / W8A16 GEMMs for larger batches)::

      partials [S, M, N] float32  --sum over S, + bias, cast-->  out [M, N]

- in the same launch, :func:`store_split_k` (the decode GEMVs): after writing its part, a
  program adds one to its output tile's counter in ``locks``; the program that finds
  ``S - 1`` there is the last of its tile, reads the ``S`` parts back, adds them and the
  bias, stores the output and puts the counter back to 0::

      program (tile t, part s):  partials[s] = acc
                                 barrier; arrived = atomic_add(locks[t], 1)   (acq_rel)
                                 if arrived == S - 1:  out = sum_s partials[s] + bias
                                                       locks[t] = 0

  One launch instead of two matters at decode, where a whole projection reads its weights
  in a few microseconds. ``locks`` is int32, zero when made (:func:`split_k_locks`) and
  zero again after every call, so a layer keeps one for its lifetime and CUDA graphs
  replay it without a memset; two launches must not share one at the same time (one
  stream, or a lock tensor per stream).

Used by the quantization plugins' kernels (AWQ W4A16, FP8 W8A16); imported only where a
kernel runs (it needs Triton).

The decoder's residual add and RMSNorm can run inside a GEMV (:func:`norm_rows_into`): each
program forms the sum of squares of its rows of ``x + residual`` over the whole K (a few KB,
read from L2), writes the normalized values of its own K range into a scratch ``xn``
[M, K] and then reads its activations from there; programs of the same range write the
same values. One launch fewer per norm at decode.

Measured tiles: a plugin may ship ``<package>/tuned/<device name>.json`` (written by
``benchmarks/quant_gemv_gpu.py --write-tuned``), which maps ``"kernel,N,K,tokens"`` to a
tile that a sweep on that GPU found fastest; :func:`tuned_config` looks one up for a call
(``tokens`` rounded up to the swept counts ``TUNED_TOKENS``), and a kernel falls back to
its own rule for shapes and devices the table lacks.
"""

from __future__ import annotations

import functools
import json
import re
from importlib import resources
from typing import Any, NamedTuple

import torch
import triton
import triton.language as tl

from engine_sdk.layers.pdl import pdl_launch, pdl_start

__all__ = [
    "SplitKPlan",
    "num_multiprocessors",
    "pick_split",
    "plan_split_k",
    "reduce_split_k",
    "split_k_locks",
    "store_split_k",
    "NORM_MAX_ROWS",
    "NormArgs",
    "fuses_add_rms_norm",
    "norm_args",
    "norm_launch_args",
    "norm_rows_into",
    "store_split_k_tile",
    "tuned_config",
    "tuned_file_name",
]

CPU_MULTIPROCESSORS = 4  # what Triton's interpreter pretends (tests on CPUs)
NORM_MAX_ROWS = 4  # norm_rows_into at most here: every program re-reads its rows
TUNED_TOKENS = (1, 4, 16)  # token counts the tile sweeps time; a call takes the next one up


@functools.lru_cache(maxsize=8)
def _multiprocessors(device: torch.device) -> int:
    return int(torch.cuda.get_device_properties(device).multi_processor_count)


class NormArgs(NamedTuple):
    """A GEMV's add+norm prologue (:func:`norm_rows_into`): the residual and RMSNorm weight
    it adds and applies, and the scratch and new-residual outputs."""

    residual: torch.Tensor
    weight: torch.Tensor
    eps: float
    xn: torch.Tensor
    new_residual: torch.Tensor


def fuses_add_rms_norm(x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor) -> bool:
    """Whether a GEMV's add+norm prologue takes these operands: ``x`` and ``residual`` [M,
    K] alike with contiguous rows, M at most ``NORM_MAX_ROWS``, ``weight`` [K]."""
    return (
        x.dim() == 2
        and 0 < x.shape[0] <= NORM_MAX_ROWS
        and x.stride(1) == 1
        and residual.shape == x.shape
        and residual.dtype == x.dtype
        and residual.stride(1) == 1
        and weight.shape == (x.shape[1],)
    )


def norm_args(
    x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, eps: float
) -> NormArgs:
    """Check the operands of a fused add+norm for ``x`` [M, K] and allocate its outputs."""
    assert fuses_add_rms_norm(x, residual, weight), "operands the add+norm prologue cannot take"
    xn = torch.empty(x.shape, dtype=x.dtype, device=x.device)
    return NormArgs(residual, weight, eps, xn, torch.empty_like(xn))


def norm_launch_args(
    x: torch.Tensor, norm: NormArgs | None
) -> tuple[tuple[object, ...], dict[str, object]]:
    """The kernel arguments of the prologue: ``(r_ptr, nw_ptr, xn_ptr, res_ptr, eps,
    stride_rm)`` and the constants ``NORM``, ``NORM_M``, ``NORM_BLOCK`` (placeholders
    when ``norm`` is None: fixed, so the plain kernel compiles once per tile)."""
    if norm is None:
        return (x, x, x, x, 0.0, x.stride(0)), {"NORM": False, "NORM_M": 1, "NORM_BLOCK": 16}
    rows, k = x.shape
    norm_m = triton.next_power_of_2(rows)
    constants = {
        "NORM": True,
        "NORM_M": norm_m,
        "NORM_BLOCK": max(16, min(triton.next_power_of_2(k), 4096 // norm_m)),
    }
    operands = (norm.residual, norm.weight, norm.xn, norm.new_residual, norm.eps)
    return (*operands, norm.residual.stride(0)), constants


def tuned_file_name(device_name: str) -> str:
    """``NVIDIA H200`` -> ``NVIDIA_H200.json``: the table file for a device name."""
    return re.sub(r"[^A-Za-z0-9]+", "_", device_name).strip("_") + ".json"


@functools.lru_cache(maxsize=16)
def _tuned_table(package: str, device_name: str) -> dict[str, dict[str, Any]]:
    path = resources.files(package).joinpath("tuned", tuned_file_name(device_name))
    if not path.is_file():
        return {}
    table: dict[str, dict[str, Any]] = json.loads(path.read_text())["configs"]
    return table


def tuned_config(
    package: str, kernel: str, device: torch.device, num_out: int, num_in: int, num_tokens: int
) -> dict[str, Any] | None:
    """The measured tile of ``package``'s table for ``kernel`` at this shape on this GPU
    (the module docstring), or None: no table for the device, no row for the shape, or not
    CUDA."""
    if device.type != "cuda":
        return None
    bucket = next((t for t in TUNED_TOKENS if num_tokens <= t), None)
    if bucket is None:
        return None
    table = _tuned_table(package, torch.cuda.get_device_name(device))
    return table.get(f"{kernel},{num_out},{num_in},{bucket}")


def num_multiprocessors(device: torch.device) -> int:
    """The device's streaming multiprocessors (``CPU_MULTIPROCESSORS`` off CUDA)."""
    if device.type != "cuda":
        return CPU_MULTIPROCESSORS
    return _multiprocessors(device)


def pick_split(num_tiles: int, num_steps: int, target_programs: int) -> tuple[int, int]:
    """``(split, steps_per_split)``: split ``num_steps`` K steps so that ``num_tiles`` output
    tiles times the split reach about ``target_programs`` programs; every part gets at
    least one step and no part is empty."""
    split = max(1, min(num_steps, -(-target_programs // max(num_tiles, 1))))
    steps_per_split = -(-num_steps // split)
    return -(-num_steps // steps_per_split), steps_per_split


@triton.jit  # type: ignore[untyped-decorator]
def _reduce_kernel(  # type: ignore[no-untyped-def]
    partials_ptr,
    bias_ptr,
    out_ptr,
    N,
    num_parts,
    stride_part,
    stride_pm,
    stride_om,
    HAS_BIAS: tl.constexpr,
    BLOCK: tl.constexpr,
    PDL: tl.constexpr = False,
):
    pdl_start(PDL)
    row = tl.program_id(0)
    cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    mask = cols < N
    acc = tl.zeros((BLOCK,), dtype=tl.float32)
    for part in range(num_parts):
        acc += tl.load(partials_ptr + part * stride_part + row * stride_pm + cols, mask=mask)
    if HAS_BIAS:
        acc += tl.load(bias_ptr + cols, mask=mask).to(tl.float32)
    tl.store(out_ptr + row * stride_om + cols, acc.to(out_ptr.dtype.element_ty), mask=mask)


def reduce_split_k(
    partials: torch.Tensor, bias: torch.Tensor | None, out_dtype: torch.dtype
) -> torch.Tensor:
    """``partials.sum(0) + bias`` in ``out_dtype``: [S, M, N] float32 -> [M, N]."""
    num_parts, num_rows, num_cols = partials.shape
    assert partials.dtype == torch.float32 and partials.stride(2) == 1
    out = torch.empty(num_rows, num_cols, dtype=out_dtype, device=partials.device)
    if num_rows == 0:
        return out
    block = min(1024, triton.next_power_of_2(num_cols))
    _reduce_kernel[(num_rows, triton.cdiv(num_cols, block))](
        partials, bias if bias is not None else partials, out, num_cols, num_parts,
        partials.stride(0), partials.stride(1), out.stride(0),
        HAS_BIAS=bias is not None, BLOCK=block, num_warps=4, **pdl_launch(partials),
    )  # fmt: skip
    return out


def split_k_locks(num_tiles: int, device: torch.device | str) -> torch.Tensor:
    """Zeroed int32 counters for :func:`store_split_k`, one per output tile of a launch."""
    return torch.zeros(max(num_tiles, 1), dtype=torch.int32, device=device)


class SplitKPlan(NamedTuple):
    """One launch of a kernel that ends in :func:`store_split_k`: how K is split and the
    tensors it writes."""

    split: int  # parts of K (programs per output tile)
    steps_per_split: int  # K steps of each part (the last may have fewer)
    out: torch.Tensor  # [M, N] in the activations' dtype
    parts: torch.Tensor  # [split, M, N] float32; ``out`` (unused) when split is 1
    locks: torch.Tensor  # int32 counters, one per output tile; ``out`` (unused) when 1


def plan_split_k(
    x: torch.Tensor,
    num_out: int,
    num_tiles: int,
    num_steps: int,
    programs_per_sm: int,
    split: int | None = None,
    locks: torch.Tensor | None = None,
) -> SplitKPlan:
    """Split ``num_steps`` K steps of ``num_tiles`` output tiles (``x`` [M, K] times a
    weight of ``num_out`` columns) so that about ``programs_per_sm`` programs per
    multiprocessor run, or into ``split`` parts; allocate the output and the parts, and
    take ``locks`` (the caller's counters, at least ``num_tiles``; None: zeroed ones made
    now, a memset)."""
    if split is None:
        target = programs_per_sm * num_multiprocessors(x.device)
        split, steps_per_split = pick_split(num_tiles, num_steps, target)
    else:
        split, steps_per_split = pick_split(1, num_steps, split)
    out = torch.empty(x.shape[0], num_out, dtype=x.dtype, device=x.device)
    if split == 1:
        return SplitKPlan(1, steps_per_split, out, out, out)
    parts = torch.empty(split, x.shape[0], num_out, dtype=torch.float32, device=x.device)
    locks = split_k_locks(num_tiles, x.device) if locks is None else locks
    assert locks.dtype == torch.int32 and locks.numel() >= num_tiles, "too few split-K locks"
    return SplitKPlan(split, steps_per_split, out, parts, locks)


@triton.jit  # type: ignore[untyped-decorator]
def store_split_k(  # type: ignore[no-untyped-def]
    acc,
    out_ptrs,
    mask,
    bias_ptrs,
    part_ptrs,
    part_stride,
    lock_ptr,
    pid_s,
    num_splits,
    HAS_BIAS: tl.constexpr,
    SPLIT: tl.constexpr,
):
    """Store a program's float32 ``acc`` tile (any 2-D shape) to ``out_ptrs`` in the output
    dtype, plus the bias (``bias_ptrs`` broadcast to the tile). With ``SPLIT`` the tile is
    part ``pid_s`` of ``num_splits``: it goes to ``part_ptrs + pid_s * part_stride``
    (float32) and the last part to arrive adds all of them (see the module docstring)."""
    if SPLIT:
        tl.store(part_ptrs + pid_s * part_stride, acc, mask=mask)
        # Every thread's part is written before one thread announces it (release); the
        # last program's acquire makes the other programs' parts visible to its loads.
        tl.debug_barrier()
        arrived = tl.atomic_add(lock_ptr, 1, sem="acq_rel", scope="gpu")
        if arrived == num_splits - 1:
            total = tl.zeros_like(acc)
            for part in range(num_splits):
                # .cg: from L2, where the other programs' stores are (not a stale L1 line).
                total += tl.load(
                    part_ptrs + part * part_stride, mask=mask, other=0.0, cache_modifier=".cg"
                )
            if HAS_BIAS:
                total += tl.load(bias_ptrs, mask=mask, other=0.0).to(tl.float32)
            tl.store(out_ptrs, total.to(out_ptrs.dtype.element_ty), mask=mask)
            tl.atomic_xchg(lock_ptr, 0, sem="relaxed", scope="gpu")
    else:
        if HAS_BIAS:
            acc += tl.load(bias_ptrs, mask=mask, other=0.0).to(tl.float32)
        tl.store(out_ptrs, acc.to(out_ptrs.dtype.element_ty), mask=mask)


@triton.jit  # type: ignore[untyped-decorator]
def store_split_k_tile(  # type: ignore[no-untyped-def]
    acc,
    out_ptr,
    part_ptr,
    bias_ptr,
    lock_ptr,
    offs_m,
    offs_n,
    M,
    N,
    stride_om,
    pid_s,
    num_splits,
    TRANSPOSED: tl.constexpr,
    HAS_BIAS: tl.constexpr,
    SPLIT: tl.constexpr,
):
    """:func:`store_split_k` for the tile of rows ``offs_m`` and columns ``offs_n`` of
    ``out`` [M, N] (row stride ``stride_om``; parts [S, M, N] contiguous; ``bias`` [N]):
    ``acc`` is [rows, columns], or [columns, rows] with ``TRANSPOSED`` (a weight-first
    dot's ``out^T``)."""
    if TRANSPOSED:
        rows = offs_m[None, :]
        cols = offs_n[:, None]
    else:
        rows = offs_m[:, None]
        cols = offs_n[None, :]
    mask = (rows < M) & (cols < N)
    store_split_k(
        acc, out_ptr + rows * stride_om + cols, mask, bias_ptr + cols + 0 * rows,
        part_ptr + rows * N + cols, M * N, lock_ptr, pid_s, num_splits, HAS_BIAS, SPLIT,
    )  # fmt: skip


@triton.jit  # type: ignore[untyped-decorator]
def norm_rows_into(  # type: ignore[no-untyped-def]
    x_ptr,
    r_ptr,
    nw_ptr,
    xn_ptr,
    res_ptr,
    M,
    K,
    eps,
    k_begin,
    k_end,
    stride_xm,
    stride_rm,
    write_res,
    NORM_M: tl.constexpr,
    NORM_BLOCK: tl.constexpr,
):
    """For rows ``s = x + r`` [M, K] (``NORM_M`` >= M): ``xn[:, k] = rms_norm(s) * nw`` for
    ``k`` in [k_begin, k_end), and ``res[:, k] = s`` there too where ``write_res``
    (``xn`` and ``res`` contiguous [M, K]), then a block barrier, so the program's threads
    may read ``xn``. The roundings are those of the unfused add+norm kernel: the sum to the
    dtype, the normalized value to the dtype, then times the weight, rounded."""
    offs_m = tl.arange(0, NORM_M)
    m_ok = offs_m < M
    offs = tl.arange(0, NORM_BLOCK)
    x_rows = x_ptr + offs_m[:, None] * stride_xm
    r_rows = r_ptr + offs_m[:, None] * stride_rm
    sq = tl.zeros((NORM_M,), dtype=tl.float32)
    for k0 in range(0, K, NORM_BLOCK):
        k = k0 + offs
        ok = m_ok[:, None] & (k < K)[None, :]
        x = tl.load(x_rows + k[None, :], mask=ok, other=0.0).to(tl.float32)
        r = tl.load(r_rows + k[None, :], mask=ok, other=0.0).to(tl.float32)
        s = (x + r).to(xn_ptr.dtype.element_ty).to(tl.float32)
        sq += tl.sum(s * s, axis=1)
    rstd = tl.rsqrt(sq / K + eps)
    for k0 in range(k_begin, k_end, NORM_BLOCK):
        k = k0 + offs
        ok = m_ok[:, None] & (k < k_end)[None, :]
        x = tl.load(x_rows + k[None, :], mask=ok, other=0.0).to(tl.float32)
        r = tl.load(r_rows + k[None, :], mask=ok, other=0.0).to(tl.float32)
        s = (x + r).to(xn_ptr.dtype.element_ty)
        out = offs_m[:, None] * K + k[None, :]
        tl.store(res_ptr + out, s, mask=ok & write_res)
        y = (s.to(tl.float32) * rstd[:, None]).to(xn_ptr.dtype.element_ty).to(tl.float32)
        nw = tl.load(nw_ptr + k, mask=k < k_end, other=0.0).to(tl.float32)
        tl.store(xn_ptr + out, (y * nw[None, :]).to(xn_ptr.dtype.element_ty), mask=ok)
    tl.debug_barrier()
