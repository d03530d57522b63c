"""The MoE kernels run in Triton's interpreter when there is no GPU."""

from engine_sdk.testing.triton_interpreter import enable

enable()
