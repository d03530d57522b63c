"""Run Triton kernels on the CPU in Triton's interpreter (for tests without a GPU).

Call ``enable()`` before the module defining the kernels is imported (a conftest does).
"""

from __future__ import annotations

import os
from typing import Any


def enable() -> bool:
    """Switch Triton to its interpreter when no CUDA device is present; True if switched."""
    import torch

    if torch.cuda.is_available():
        return False
    os.environ.setdefault("TRITON_INTERPRET", "1")
    from triton.runtime import interpreter

    original = getattr(interpreter, "_patch_lang_tensor", None)
    if original is None or getattr(original, "_engine_patched", False):
        return True  # another Triton version: nothing to patch

    def patched(tensor: Any, scope: Any) -> None:
        # Scalars are 1-element arrays in the interpreter; numpy >= 2.4 refuses int() on
        # them, which breaks `range(0, scalar_tensor, ...)` loops. Index the element.
        original(tensor, scope)
        scope.set_attr(tensor, "__index__", lambda self: int(self.handle.data.reshape(-1)[0]))

    patched._engine_patched = True  # type: ignore[attr-defined]
    interpreter._patch_lang_tensor = patched
    return True
