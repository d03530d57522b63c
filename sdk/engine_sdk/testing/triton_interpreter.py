"""Run Triton kernels on the CPU in Triton's interpreter (for tests without a GPU).

Call ``enable()`` before the module defining the kernels is imported (a conftest does).

Two interpreter bugs of Triton 3.6 are patched, in interpreter runs only: scalar tensors
refuse ``int()`` under numpy >= 2.4 (breaking ``range`` over a scalar), and the float <->
fp8 conversion (``_convert_float``) rounds half up without carrying into the exponent
(7.9 -> 4.0 in e4m3) and reads the e4m3fn NaN as 480, so fp8 casts are redirected to
torch's conversion (round to nearest even, as the GPU's ``cvt.rn`` does).
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
    _patch_fp8_casts()
    return True


def _patch_fp8_casts() -> None:
    """Redirect the interpreter's fp8 casts to torch's conversion (see ``enable``)."""
    import numpy as np
    import torch
    import triton.language as tl
    from triton.runtime import interpreter

    builder_cls = interpreter.InterpreterBuilder
    original = builder_cls.create_fp_to_fp
    if getattr(original, "_engine_patched", False):
        return
    torch_dtypes = {
        tl.float8e4nv: torch.float8_e4m3fn,
        tl.float8e5: torch.float8_e5m2,
        tl.float16: torch.float16,
        tl.bfloat16: torch.bfloat16,
        tl.float32: torch.float32,
    }
    storage = {torch.float8_e4m3fn: torch.uint8, torch.float8_e5m2: torch.uint8}
    storage[torch.bfloat16] = torch.uint16

    def to_torch(data: Any, dtype: torch.dtype) -> torch.Tensor:
        raw = torch.from_numpy(np.ascontiguousarray(data))
        return raw.view(dtype) if dtype in storage else raw

    def from_torch(tensor: torch.Tensor) -> Any:
        if tensor.dtype in storage:
            tensor = tensor.view(storage[tensor.dtype])
        return tensor.numpy()

    def create_fp_to_fp(self: Any, src: Any, dst_type: Any, rounding_mode: Any) -> Any:
        src_ty, dst_ty = src.dtype.scalar, dst_type.scalar
        fp8 = (tl.float8e4nv, tl.float8e5)
        if (src_ty in fp8 or dst_ty in fp8) and src_ty in torch_dtypes and dst_ty in torch_dtypes:
            converted = to_torch(src.data, torch_dtypes[src_ty]).to(torch_dtypes[dst_ty])
            return interpreter.TensorHandle(from_torch(converted), dst_ty)
        return original(self, src, dst_type, rounding_mode)

    create_fp_to_fp._engine_patched = True  # type: ignore[attr-defined]
    builder_cls.create_fp_to_fp = create_fp_to_fp
