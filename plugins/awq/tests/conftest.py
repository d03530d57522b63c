"""Run the AWQ Triton kernels in Triton's interpreter when there is no GPU (with the SDK's
fixes for the interpreter's scalar indices and bf16 / fp8 casts; see
engine_sdk.testing.triton_interpreter)."""

from engine_sdk.testing.triton_interpreter import enable

enable()
