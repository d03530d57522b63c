"""The attention kernel builds for an sm90 target when its float argument arrives as
float64, as torch.compile (inductor's wrapper of user Triton kernels) passes it. Lowering
to Triton's IR needs no GPU; it runs in a subprocess because this folder's conftest puts
Triton in its interpreter."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

LOWER = """
import sys
import triton._C.libtriton as libtriton
from engine_triton.kernels import paged_attention_kernel as kernel
from triton.backends.compiler import GPUTarget
from triton.backends.nvidia.compiler import CUDABackend
from triton.compiler import ASTSource

block_q = int(sys.argv[1])
constants = {
    "GROUP": 2, "BLOCK_SIZE": 16, "BLOCK_Q": block_q, "BLOCK_M": 64 if block_q > 1 else 16,
    "BLOCK_N": 64, "HEAD_DIM": 128, "HEAD_DIM_P": 128, "DOT_PRECISION": "tf32", "FP8": False,
    "WINDOW": 0, "SOFT_CAP": 0.0, "SPLITS": 1, "part_acc_ptr": None, "part_ml_ptr": None,
}
signature = {n: ("*bf16" if n.endswith("_ptr") else "i32") for n in kernel.arg_names}
for name in ("block_tables_ptr", "seq_lens_ptr", "query_start_ptr", "work_seq_ptr",
             "work_qblock_ptr"):
    signature[name] = "*i32"
signature.update(kv_scales_ptr="*fp32", scale="fp64")
signature.update({n: "constexpr" for n in constants})
target = GPUTarget("cuda", 90, 32)
backend = CUDABackend(target)
options = backend.parse_options({})
context = libtriton.ir.context()
libtriton.ir.load_dialects(context)
backend.load_dialects(context)
module = ASTSource(kernel, signature, constants).make_ir(
    target, options, backend.get_codegen_implementation(options), backend.get_module_map(),
    context,
)
print("lowered", "tt.func" in str(module))
"""


@pytest.mark.parametrize("block_q", [1, 32])
def test_attention_kernel_lowers_with_a_float64_scale(block_q: int) -> None:
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    proc = subprocess.run(
        [sys.executable, "-c", LOWER, str(block_q)], env=env, capture_output=True, text=True,
        timeout=300,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.strip() == "lowered True"
