# mypy: disable-error-code="no-untyped-def,untyped-decorator"
"""Programmatic dependent launch (PDL) for the decode step's Triton kernels (sm90 and newer).

A decode step at a few tokens is a chain of short kernels (about ten a layer, most of them
2-5 us), and every one pays a launch and a ramp-up while the previous one drains. With
PDL a kernel is launched as soon as every program of the kernel before it has started
(``griddepcontrol.launch_dependents``), so its programs are resident and waiting when the
previous kernel ends, instead of being launched after it; each program first waits for
the previous kernel to finish and its writes to be visible (``griddepcontrol.wait``). The
attribute travels into CUDA graphs as a programmatic edge.

The contract, for a kernel that takes ``PDL``:

- it calls :func:`pdl_start` at the very top, before any load or store, in every program
  (so no program can read what the previous kernel still writes, nor finish before it:
  the kernel after it, waiting on this one, then also waits on the one before);
- its launch passes ``**pdl_launch(x)``: ``PDL=True`` and Triton's ``launch_pdl=True``
  on a CUDA device of compute capability 9 or more, ``PDL=False`` elsewhere (CPU, the
  interpreter, older GPUs), where the kernel compiles as before.

A kernel launched without the attribute (torch's, cuBLAS's, any launch without
``pdl_launch``) waits for everything before it, as always.

Off by default: on an H100 it made W2 6-36% slower (docs/performance.md, round 19).
``ENGINE_PDL=1`` turns it on (``benchmarks/pdl_gpu.py`` checks greedy tokens on and off,
``benchmarks/round17_gpu.sh`` times it).
"""

from __future__ import annotations

import functools
import os

import torch
import triton
import triton.language as tl

__all__ = ["ENABLED", "PREFETCH", "pdl_enabled", "pdl_launch", "pdl_prefetch_rows", "pdl_start"]

ENABLED = os.environ.get("ENGINE_PDL", "0") == "1"
PREFETCH = os.environ.get("ENGINE_PDL_PREFETCH", "1") != "0"


@functools.lru_cache(maxsize=16)
def _capable(index: int) -> bool:
    return torch.cuda.get_device_capability(index)[0] >= 9


def pdl_enabled(x: torch.Tensor) -> bool:
    """Whether launches on ``x``'s device take PDL: on (``ENGINE_PDL``), a CUDA tensor, a
    compute capability of 9 or more, and not Triton's interpreter."""
    if not ENABLED or not x.is_cuda or os.environ.get("TRITON_INTERPRET") == "1":
        return False
    return _capable(x.device.index if x.device.index is not None else torch.cuda.current_device())


def pdl_launch(x: torch.Tensor, prefetch: bool = False) -> dict[str, bool]:
    """The launch keywords of a ``PDL`` kernel working on ``x``: ``{"PDL": True,
    "launch_pdl": True}`` where :func:`pdl_enabled`, else ``{"PDL": False}``.
    ``prefetch``: the kernel takes ``PREFETCH`` too (a GEMV that calls
    :func:`pdl_prefetch_rows`), set from ``ENGINE_PDL_PREFETCH`` (default on) with PDL,
    False without. The constexprs are passed even at their defaults: torch.compile's
    launcher of a user kernel has no argument for a constexpr the call site left out
    (``engine_sdk.testing.launches``)."""
    if not pdl_enabled(x):
        return {"PDL": False, **({"PREFETCH": False} if prefetch else {})}
    return {"PDL": True, "launch_pdl": True, **({"PREFETCH": PREFETCH} if prefetch else {})}


@triton.jit
def pdl_start(PDL: tl.constexpr):
    """The top of a ``PDL`` kernel: wait for the kernel before it (its writes visible),
    then let the kernel after this one launch. Compiles to nothing when ``PDL`` is False."""
    if PDL:
        tl.extra.cuda.gdc_wait()
        tl.extra.cuda.gdc_launch_dependents()


@triton.jit
def pdl_prefetch_rows(ptr, first_row, num_rows, stride_row, row_elements,
                      ROWS: tl.constexpr, STEP: tl.constexpr, PREFETCH: tl.constexpr,
                      GATED: tl.constexpr = False):  # fmt: skip
    """Before :func:`pdl_start`: ask L2 for rows ``first_row .. + ROWS`` (those in ``0 ..
    num_rows``) of a weight, ``row_elements`` of ``ptr``'s type each, rows ``stride_row``
    elements apart, in 128-byte lines, ``STEP`` elements of each row an instruction;
    ``GATED``: the weight is a merged ``[gate | up]`` of ``2 * num_rows`` rows, and the
    matching up rows ``num_rows + first_row ..`` are asked for too. A
    prefetch only moves lines into L2, which every later load sees coherently, so it may
    run while the kernel before this one still runs: a GEMV's weights (which no kernel of
    the step writes) then stream from HBM during that kernel's tail, and its loads after
    the wait hit L2. Nothing when ``PREFETCH`` is False."""
    if PREFETCH:
        _prefetch_lines(ptr, first_row, num_rows, stride_row, row_elements, ROWS, STEP)
        if GATED:
            _prefetch_lines(ptr, num_rows + first_row, 2 * num_rows, stride_row, row_elements,
                            ROWS, STEP)  # fmt: skip


@triton.jit
def _prefetch_lines(ptr, first_row, num_rows, stride_row, row_elements,
                    ROWS: tl.constexpr, STEP: tl.constexpr):  # fmt: skip
    """One block of rows of :func:`pdl_prefetch_rows`."""
    width: tl.constexpr = ptr.dtype.element_ty.primitive_bitwidth // 8
    LINES: tl.constexpr = (STEP * width + 127) // 128
    rows = first_row + tl.arange(0, ROWS)[:, None]
    row_ok = (rows >= 0) & (rows < num_rows)
    base = ptr.to(tl.pointer_type(tl.int8))
    row_at = base + rows.to(tl.int64) * stride_row * width
    for b0 in range(0, row_elements * width, LINES * 128):
        lines = b0 + tl.arange(0, LINES)[None, :] * 128
        at = tl.where(row_ok & (lines < row_elements * width), row_at + lines, base)
        tl.inline_asm_elementwise(
            "prefetch.global.L2 [$1]; // $0", "=r,l", [at], dtype=tl.int32, is_pure=False,
            pack=1,
        )  # fmt: skip
