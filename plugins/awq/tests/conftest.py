"""Run the AWQ Triton kernel in Triton's interpreter when there is no GPU."""

from __future__ import annotations

import os

import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")
    from triton.runtime import interpreter

    _original_patch = interpreter._patch_lang_tensor

    def _patch_lang_tensor(tensor, scope):  # type: ignore[no-untyped-def]
        # Scalars are 1-element arrays in the interpreter; numpy >= 2.4 refuses int() on
        # them, which breaks `range(scalar_tensor, ...)` loops. Index the element.
        _original_patch(tensor, scope)
        scope.set_attr(tensor, "__index__", lambda self: int(self.handle.data.reshape(-1)[0]))

    interpreter._patch_lang_tensor = _patch_lang_tensor
