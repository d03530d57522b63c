"""Compile a Triton kernel for an NVIDIA GPU on a machine without one (tests on CPUs).

Triton's interpreter runs a kernel's arithmetic but never builds it, so a kernel that only
a GPU compile rejects (types that diverge in a loop, an unsupported atomic, a layout
ptxas refuses) passes every interpreter test. ``compile_for_gpu`` runs the whole
pipeline (Triton IR, GPU IR, LLVM, PTX, ``ptxas`` from Triton's wheel) for a target such
as sm90 (H100/H200) in a subprocess, since kernels defined while the interpreter is on are
interpreter functions::

    report = compile_for_gpu(
        "engine_triton.kernels", "paged_attention_kernel",
        constants={"SPLITS": 4, "COMBINE": True, ...},
        types={"scale": "fp64", "lock_ptr": "*i32"},
    )
    assert report["cubin_bytes"] > 0

An argument's type is taken from ``types``, else ``pointer`` for names ending in
``_ptr`` and ``i32`` for the rest; every name in ``constants`` is a ``constexpr``, and a
``constexpr`` left out takes its default, as in a launch.

``assert_pdl_order(report["ptx"])`` checks a kernel compiled with ``PDL=True``
(``engine_sdk.layers.pdl``): it waits for the kernel before it ahead of its first global
load, store or atomic (an L2 prefetch may come first), and lets the next kernel launch.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from typing import Any

_SCRIPT = r"""
import importlib, json, sys
import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource

spec = json.loads(sys.argv[1])
kernel = getattr(importlib.import_module(spec["module"]), spec["kernel"])
constants = dict(spec["constants"])
for param in kernel.params:  # constexprs left out take their defaults, as in a launch
    if param.is_constexpr and param.name not in constants and param.has_default:
        constants[param.name] = param.default
signature = {}
for name in kernel.arg_names:
    if name in constants:
        signature[name] = "constexpr"
    elif name in spec["types"]:
        signature[name] = spec["types"][name]
    else:
        signature[name] = spec["pointer"] if name.endswith("_ptr") else "i32"
attrs = {(kernel.arg_names.index(name),): [["tt.divisibility", 16]] for name in spec["aligned"]}
target = GPUTarget("cuda", spec["arch"], 32)
compiled = triton.compile(
    ASTSource(kernel, signature, constants, attrs), target=target, options=spec["options"]
)
print(json.dumps({
    "cubin_bytes": len(compiled.asm["cubin"]),
    "ptx": compiled.asm["ptx"],
    "shared": compiled.metadata.shared,
}))
"""


def compile_for_gpu(
    module: str,
    kernel: str,
    constants: dict[str, Any],
    types: dict[str, str] | None = None,
    pointer: str = "*bf16",
    arch: int = 90,
    num_warps: int = 4,
    num_stages: int = 3,
    timeout: float = 300.0,
    aligned: list[str] | None = None,
) -> dict[str, Any]:
    """Compile ``module.kernel`` for ``sm_<arch>``; returns ``cubin_bytes``, the ``ptx`` text
    and the ``shared`` memory bytes, or raises ``AssertionError`` with the compiler's
    message. ``aligned``: arguments compiled as multiples of 16 (a pointer 16-byte aligned,
    an integer divisible by 16), as Triton specializes a launch whose values are; without
    it, loads of 2-byte elements stay scalar (no vector loads, no cp.async)."""
    spec = {
        "module": module,
        "kernel": kernel,
        "constants": constants,
        "types": types or {},
        "pointer": pointer,
        "arch": arch,
        "options": {"num_warps": num_warps, "num_stages": num_stages},
        "aligned": aligned or [],
    }
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    proc = subprocess.run(
        [sys.executable, "-c", _SCRIPT, json.dumps(spec)],
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    if proc.returncode != 0:
        message = proc.stderr[-3000:]
        raise AssertionError(f"{module}.{kernel} does not compile for sm_{arch}:\n{message}")
    report: dict[str, Any] = json.loads(proc.stdout.strip().splitlines()[-1])
    return report


_GLOBAL_ACCESS = re.compile(r"\b(?:ld|st|atom|red|cp\.async)[.\w]*\.global\b")


def assert_pdl_order(ptx: str, prefetch: bool = False) -> None:
    """``ptx`` waits (``griddepcontrol.wait``) before its first global load, store or atomic
    and has ``griddepcontrol.launch_dependents``: the contract of ``engine_sdk.layers.pdl``.
    ``prefetch``: L2 prefetches (``prefetch.global.L2``, which only warm the cache) come
    before the wait."""
    wait = ptx.find("griddepcontrol.wait")
    assert wait >= 0, "no griddepcontrol.wait: compiled without PDL"
    if prefetch:
        first_prefetch = ptx.find("prefetch.global.L2")
        assert 0 <= first_prefetch < wait, "no L2 prefetch ahead of the wait"
    assert "griddepcontrol.launch_dependents" in ptx, "the next kernel is never let launch"
    first = _GLOBAL_ACCESS.search(ptx)
    assert first is not None and first.start() > wait, (
        f"a global access ({first.group(0) if first else None}) comes before the wait"
    )
