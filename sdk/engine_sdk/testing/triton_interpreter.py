"""Run Triton kernels on the CPU in Triton's interpreter (for tests without a GPU).

Call ``enable()`` before the module defining the kernels is imported (a conftest does).

Interpreter bugs of Triton 3.6 are patched, in interpreter runs only: scalar tensors
refuse ``int()`` under numpy >= 2.4 (breaking ``range`` over a scalar); the float <->
fp8 conversion (``_convert_float``) rounds half up without carrying into the exponent
(7.9 -> 4.0 in e4m3) and reads the e4m3fn NaN as 480, so fp8 casts are redirected to
torch's conversion (round to nearest even, as the GPU's ``cvt.rn`` does); bfloat16 is
stored as its raw 16 bits, which casts from integers / fp16 and ``tl.dot`` treated as
numbers, so those casts go through torch and bf16 dot operands are widened to float32
first.
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
    _patch_bf16()
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


def _patch_bf16() -> None:
    """bf16 casts from/to anything but float32, and bf16 dots, through torch (see ``enable``)."""
    import numpy as np
    import torch
    import triton.language as tl
    from triton.runtime import interpreter

    builder_cls = interpreter.InterpreterBuilder
    cast_impl, create_dot = builder_cls.cast_impl, builder_cls.create_dot
    if getattr(cast_impl, "_engine_patched", False):
        return

    def as_torch(handle: Any) -> torch.Tensor:
        data = np.ascontiguousarray(handle.data)
        if handle.dtype.scalar == tl.bfloat16:
            return torch.from_numpy(data.view(np.uint16)).view(torch.bfloat16)
        return torch.from_numpy(data)

    def bf16_handle(tensor: torch.Tensor) -> Any:
        bits = tensor.to(torch.bfloat16).view(torch.uint16).numpy()
        return interpreter.TensorHandle(bits, tl.bfloat16)

    def patched_cast(self: Any, src: Any, dst_type: Any) -> Any:
        src_ty, dst_ty = src.dtype.scalar, dst_type.scalar
        if dst_ty == tl.bfloat16 and src_ty not in (tl.float32, tl.bfloat16):
            return bf16_handle(as_torch(src).float())
        if src_ty == tl.bfloat16 and dst_ty != tl.float32 and dst_ty != tl.bfloat16:
            data = as_torch(src).float().numpy().astype(interpreter._get_np_dtype(dst_type))
            return interpreter.TensorHandle(data, dst_ty)
        return cast_impl(self, src, dst_type)

    def patched_dot(self: Any, a: Any, b: Any, d: Any, *args: Any) -> Any:
        if tl.bfloat16 in (a.dtype.scalar, b.dtype.scalar):
            a_data, b_data = as_torch(a).float().numpy(), as_torch(b).float().numpy()
            result = np.matmul(a_data, b_data, dtype=d.data.dtype) + d.data
            return interpreter.TensorHandle(result, d.dtype.scalar)
        return create_dot(self, a, b, d, *args)

    patched_cast._engine_patched = True  # type: ignore[attr-defined]
    builder_cls.cast_impl = patched_cast
    builder_cls.create_dot = patched_dot
