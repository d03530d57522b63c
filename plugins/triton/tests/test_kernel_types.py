"""The attention kernels build for an sm90 target (H100/H200) from a CPU machine: the whole
compile, ptxas included (``engine_sdk.testing.gpu_compile``), which Triton's interpreter
never runs. The float argument arrives as float64, as torch.compile (inductor's wrapper of
user Triton kernels) passes it; the split decode merges its parts with atomics."""

from __future__ import annotations

import pytest
from engine_sdk.testing.gpu_compile import compile_for_gpu

_TYPES = {
    "kv_scales_ptr": "*fp32", "scale": "fp64", "block_tables_ptr": "*i32",
    "seq_lens_ptr": "*i32", "query_start_ptr": "*i32", "work_seq_ptr": "*i32",
    "work_qblock_ptr": "*i32", "part_acc_ptr": "*fp32", "part_ml_ptr": "*fp32",
    "lock_ptr": "*i32",
}  # fmt: skip


@pytest.mark.parametrize(
    "block_q,splits,combine", [(1, 1, False), (32, 1, False), (1, 4, True), (1, 16, False)]
)
def test_attention_kernel_compiles_for_sm90(block_q: int, splits: int, combine: bool) -> None:
    constants = {
        "GROUP": 2, "BLOCK_SIZE": 16, "BLOCK_Q": block_q, "BLOCK_M": 64 if block_q > 1 else 16,
        "BLOCK_N": 64 if splits == 1 else 32, "HEAD_DIM": 128, "HEAD_DIM_P": 128,
        "DOT_PRECISION": "tf32", "FP8": False, "WINDOW": 0, "SOFT_CAP": 0.0,
        "SPLITS": splits, "COMBINE": combine,
    }  # fmt: skip
    report = compile_for_gpu(
        "engine_triton.kernels", "paged_attention_kernel", constants, _TYPES,
        num_stages=2 if block_q > 1 else 3,
    )  # fmt: skip
    assert report["cubin_bytes"] > 0
    # the in-launch merge is there exactly when asked for (its counter's atomic add)
    assert ("atom.global" in report["ptx"]) == combine


def test_combine_kernel_compiles_for_sm90() -> None:
    report = compile_for_gpu(
        "engine_triton.kernels", "combine_splits_kernel",
        {"SPLITS": 8, "HEAD_DIM": 128, "HEAD_DIM_P": 128},
        {"part_acc_ptr": "*fp32", "part_ml_ptr": "*fp32"}, num_warps=1,
    )  # fmt: skip
    assert report["cubin_bytes"] > 0
