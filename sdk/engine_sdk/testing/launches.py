"""Which Triton launches leave a defaulted constexpr to its default (Triton's interpreter).

torch.compile (inductor) launches a user Triton kernel with the arguments its call site
passed; a constexpr left at its default is missing from its launcher's call, and the
launch fails (``launcher() missing 1 required positional argument: '_grid_2'``, torch
2.11 on an H100). So the decode step's launches name every constexpr. In a test on the
CPU::

    with recorded_launches() as seen:
        model_forward()
    assert "gemv_kernel" in seen.kernels
    assert not seen.unpassed, seen.unpassed   # {(kernel name, parameter name), ...}
"""

from __future__ import annotations

import contextlib
import inspect
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

__all__ = ["Launches", "constexpr_defaults", "recorded_launches"]


def constexpr_defaults(kernel: Any) -> dict[str, Any]:
    """``kernel``'s constexpr parameters that have a default, with their defaults."""
    fn = kernel
    while hasattr(fn, "fn"):  # JITFunction, the interpreter's function, autotuners
        fn = fn.fn
    params = inspect.signature(fn).parameters.values()
    return {
        p.name: p.default
        for p in params
        if p.default is not p.empty and "constexpr" in str(p.annotation)
    }


@dataclass
class Launches:
    """The kernels launched, and each ``(kernel, constexpr)`` a launch left to its default."""

    kernels: set[str] = field(default_factory=set)
    unpassed: set[tuple[str, str]] = field(default_factory=set)


@contextlib.contextmanager
def recorded_launches() -> Iterator[Launches]:
    """Record the launches made inside the block. Needs the interpreter
    (``engine_sdk.testing.triton_interpreter.enable`` before the kernels are defined)."""
    from triton.runtime.interpreter import InterpretedFunction

    seen = Launches()
    original = InterpretedFunction.run

    def run(self: Any, *args: Any, **kwargs: Any) -> Any:
        name = self.fn.__name__
        passed = set(list(inspect.signature(self.fn).parameters)[: len(args)]) | set(kwargs)
        seen.kernels.add(name)
        seen.unpassed.update((name, n) for n in constexpr_defaults(self) if n not in passed)
        return original(self, *args, **kwargs)

    InterpretedFunction.run = run
    try:
        yield seen
    finally:
        InterpretedFunction.run = original
