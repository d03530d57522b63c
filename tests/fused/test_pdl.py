"""Programmatic dependent launch (``engine_sdk.layers.pdl``): every kernel launched with
``pdl_launch`` builds for sm90 with ``PDL=True`` and waits for the kernel before it ahead of
its first global load, store or atomic (``assert_pdl_order`` on the PTX), so no program can
read what the previous kernel still writes; the launch keywords appear only where the GPU
has the feature. Constants: the decode step's launches at one token (Qwen3-0.6B and
Llama-3.1-8B shapes, bf16); the GPU run of the same kernels is the suite's
(``benchmarks/pdl_gpu.py``: greedy tokens with PDL on and off)."""

from __future__ import annotations

import ast
import math
import types
from pathlib import Path
from typing import Any

import pytest
import torch
from engine_sdk.layers import pdl
from engine_sdk.testing.gpu_compile import assert_pdl_order, compile_for_gpu

ROOT = Path(__file__).resolve().parents[2]
_TILED = {"qw_ptr": "*i32", "z_ptr": "*u8", "s_ptr": "*fp16"}
_ATTENTION = {
    "GROUP": 2, "BLOCK_SIZE": 16, "BLOCK_Q": 1, "BLOCK_M": 16, "BLOCK_N": 32, "HEAD_DIM": 128,
    "HEAD_DIM_P": 128, "DOT_PRECISION": "tf32", "FP8": False, "SPLITS": 4, "COMBINE": True,
}  # fmt: skip
_ATTENTION_TYPES = {
    "kv_scales_ptr": "*fp32", "scale": "fp32", "block_tables_ptr": "*i32",
    "seq_lens_ptr": "*i32", "query_start_ptr": "*i32", "work_seq_ptr": "*i32",
    "work_qblock_ptr": "*i32", "part_acc_ptr": "*fp32", "part_ml_ptr": "*fp32",
    "lock_ptr": "*i32",
}  # fmt: skip
_GEMV = {"HAS_BIAS": False, "BLOCK_M": 1, "BLOCK_N": 2}
_AWQ = {"GROUP": 128, "CHUNK": 128, "NPG": math.gcd(8, 128 // 16), "HAS_BIAS": False}
_SPLIT_K = {"part_ptr": "*fp32", "lock_ptr": "*i32", "eps": "fp32"}
_NORM_OFF = {"NORM": False, "NORM_M": 1, "NORM_BLOCK": 16}

# kernel -> (module, constants, argument types, warps): one launch of each
CASES: dict[str, tuple[str, dict[str, Any], dict[str, str], int]] = {
    "rms_norm_kernel": ("engine_sdk.layers._fused_kernels", {"BLOCK": 1024}, {"eps": "fp32"}, 4),
    "add_rms_norm_kernel": (
        "engine_sdk.layers._fused_kernels",
        {"BLOCK": 4096},
        {"eps": "fp32"},
        4,
    ),
    "silu_mul_kernel": ("engine_sdk.layers._fused_kernels", {"BLOCK": 1024}, {}, 4),
    "silu_mul_merged_kernel": ("engine_sdk.layers._fused_kernels", {"BLOCK": 1024}, {}, 4),
    "rotary_kernel": (
        "engine_sdk.layers._fused_kernels",
        {"HEADS_P": 16, "HALF_P": 64, "PASS_P": 1, "HAS_PASS": False},
        {},
        4,
    ),
    "qkv_norm_rope_kernel": (
        "engine_sdk.layers._fused_kernels",
        {"HEAD_DIM": 128, "HALF_P": 64, "HEADS_P": 16, "HAS_NORM": True, "STORE": True},
        {"slot_ptr": "*i64", "kv_scales_ptr": "*fp32", "eps": "fp32"},
        4,
    ),
    "gemv_kernel": (
        "engine_sdk.layers._gemv_kernels",
        {**_GEMV, "BLOCK_K": 2048, "PREFETCH": True},
        {},
        4,
    ),
    "gemv_add_rms_norm_kernel": (
        "engine_sdk.layers._gemv_kernels",
        {**_GEMV, "BLOCK_K": 1024, "GATED": True, "PREFETCH": True},
        {"eps": "fp32"},
        4,
    ),
    "sample_rows_kernel": (
        "engine_sdk.layers._sampling_kernels",
        {"BLOCK": 4096, "CHUNKS_P": 64},
        {
            "logits_ptr": "*fp32",
            "temps_ptr": "*fp32",
            "step_ptr": "*i64",
            "part_val_ptr": "*fp32",
            "part_idx_ptr": "*i32",
            "lock_ptr": "*i32",
            "out_ptr": "*i64",
            "bits_ptr": "*i32",
        },
        4,
    ),
    "_reduce_kernel": (
        "engine_sdk.layers.split_k",
        {"HAS_BIAS": False, "BLOCK": 1024},
        {"partials_ptr": "*fp32"},
        4,
    ),
    "store_kv_kernel": (
        "engine_triton.kernels",
        {"NUM_KV_HEADS": 8, "NUM_KV_HEADS_P": 8, "HEAD_DIM": 128, "HEAD_DIM_P": 128},
        {"slot_ptr": "*i64", "kv_scales_ptr": "*fp32"},
        4,
    ),
    "paged_attention_kernel": ("engine_triton.kernels", _ATTENTION, _ATTENTION_TYPES, 4),
    "combine_splits_kernel": (
        "engine_triton.kernels",
        {"SPLITS": 8, "HEAD_DIM": 128, "HEAD_DIM_P": 128},
        {"part_acc_ptr": "*fp32", "part_ml_ptr": "*fp32"},
        1,
    ),
    "engine_fp8.gemv:_gemv_kernel": (
        "engine_fp8.gemv",
        {
            "SCALE": 1,
            "SCALE_ROWS": 1,
            "SCALE_COLS": 1,
            "BLOCK_M": 1,
            "BLOCK_N": 32,
            "BLOCK_K": 256,
            "NUM_STAGES": 4,
            "USE_DOT": False,
            "HAS_BIAS": False,
            "SPLIT": True,
            **_NORM_OFF,
        },
        {"w_ptr": "*fp8e4nv", "s_ptr": "*fp32", "bias_ptr": "*fp32", **_SPLIT_K},
        4,
    ),
    "engine_awq.gemv:_gemv_kernel": (
        "engine_awq.gemv",
        {
            **_AWQ,
            "BLOCK_M": 1,
            "BLOCK_N": 64,
            "NUM_STAGES": 2,
            "USE_DOT": False,
            "SPLIT": True,
            **_NORM_OFF,
        },
        {**_TILED, "bias_ptr": "*fp16", "magic": "i32", **_SPLIT_K},
        4,
    ),
    "awq_rows_kernel": (
        "engine_awq.rows",
        {**_AWQ, "BLOCK_M": 1, "BLOCK_N": 2, "BLOCK_C": 8, "PREFETCH": True},
        {**_TILED, "b_ptr": "*fp16", "eps": "fp32", "magic": "i32"},
        4,
    ),
    "awq_wide_kernel": (
        "engine_awq.wide",
        {
            **_AWQ,
            "BLOCK_N": 4,
            "BLOCK_C": 32,
            "NORM": True,
            "NORM_K": 4096,
            "GATED": True,
            "PREFETCH": True,
        },
        {**_TILED, "b_ptr": "*fp16", "eps": "fp32"},
        2,
    ),
}


@pytest.mark.parametrize("name", list(CASES))
def test_pdl_kernel_waits_before_any_global_access(name: str) -> None:
    module, constants, arg_types, warps = CASES[name]
    kernel = name.split(":")[-1]
    report = compile_for_gpu(module, kernel, {**constants, "PDL": True}, arg_types, num_warps=warps)
    assert report["cubin_bytes"] > 0
    assert_pdl_order(report["ptx"], prefetch=constants.get("PREFETCH", False))
    assert ("prefetch.global.L2" in report["ptx"]) == constants.get("PREFETCH", False)


def test_without_pdl_the_kernel_has_no_grid_dependency_control() -> None:
    """``PDL`` defaults to False: the kernel compiles as before the change."""
    module, constants, arg_types, warps = CASES["gemv_kernel"]
    constants = {k: v for k, v in constants.items() if k != "PREFETCH"}
    report = compile_for_gpu(module, "gemv_kernel", constants, arg_types, num_warps=warps)
    assert "griddepcontrol" not in report["ptx"]
    with pytest.raises(AssertionError, match="without PDL"):
        assert_pdl_order(report["ptx"])


# engine_sdk.layers.gemv launches its kernels through the functions that import them
_ALIASES = {"kernel": "gemv_kernel", "_norm_kernel()": "gemv_add_rms_norm_kernel"}


def _pdl_launch_sites() -> set[str]:
    """The kernels launched with ``**pdl_launch(...)`` anywhere in the SDK and plugins, as
    ``module:kernel`` where the kernel's name is not unique."""
    sites = set()
    for path in [*ROOT.glob("sdk/engine_sdk/**/*.py"), *ROOT.glob("plugins/*/engine_*/**/*.py")]:
        tree = ast.parse(path.read_text())
        for node in ast.walk(tree):
            if not isinstance(node, ast.Call) or not isinstance(node.func, ast.Subscript):
                continue
            uses_pdl = any(
                kw.arg is None and isinstance(kw.value, ast.Call)
                and getattr(kw.value.func, "id", "") == "pdl_launch"
                for kw in node.keywords
            )  # fmt: skip
            if uses_pdl:
                target = node.func.value
                name = target.id if isinstance(target, ast.Name) else ast.unparse(target)
                module = ".".join(path.relative_to(path.parents[1]).with_suffix("").parts)
                sites.add(f"{module}:{name}" if name == "_gemv_kernel" else name)
    return sites


def test_every_pdl_launch_has_a_compile_case() -> None:
    """A new ``pdl_launch`` site needs its kernel here: a kernel launched with the attribute
    but without the wait at its top would race with the kernel before it."""
    sites = _pdl_launch_sites()
    named = {_ALIASES.get(site, site) for site in sites}
    assert "paged_attention_kernel" in named and "awq_rows_kernel" in named  # the scan works
    missing = named - set(CASES)
    assert not missing, f"launched with pdl_launch, no compile case: {sorted(missing)}"


def test_every_pdl_kernel_waits_at_its_top() -> None:
    """``pdl_start(PDL)`` is a statement of each kernel's body itself (every program runs
    it), and what comes before it reads and writes no memory: program ids, constants and
    the L2 prefetch of the weights (``pdl_prefetch_rows``) only."""
    for name, (module, *_rest) in CASES.items():
        kernel = name.split(":")[-1]
        parts = module.split(".")
        package = "sdk" if parts[0] == "engine_sdk" else f"plugins/{parts[0][len('engine_') :]}"
        tree = ast.parse((ROOT / package / Path(*parts)).with_suffix(".py").read_text())
        fn = next(n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == kernel)
        docstring = isinstance(fn.body[0], ast.Expr) and isinstance(fn.body[0].value, ast.Constant)
        sources = [ast.unparse(n) for n in fn.body[int(docstring) :]]
        assert "pdl_start(PDL)" in sources, f"{name} has no pdl_start(PDL) in its body"
        before = "\n".join(sources[: sources.index("pdl_start(PDL)")])
        for access in ("tl.load", "tl.store", "tl.atomic", "_shrink_program", "row_norms"):
            assert access not in before, f"{name} calls {access} before the wait"


class _FakeCuda:
    is_cuda = True
    device = torch.device("cuda", 0)


@pytest.mark.parametrize(
    "enabled,capability,interpret,expected",
    [
        (True, 9, None, {"PDL": True, "launch_pdl": True}),  # H100 / H200
        (True, 8, None, {"PDL": False}),  # A100: no griddepcontrol
        (False, 9, None, {"PDL": False}),  # ENGINE_PDL=0
        (True, 9, "1", {"PDL": False}),  # Triton's interpreter
    ],
)
def test_pdl_launch_keywords(
    monkeypatch: pytest.MonkeyPatch,
    enabled: bool,
    capability: int,
    interpret: str | None,
    expected: dict[str, bool],
) -> None:
    monkeypatch.setattr(pdl, "ENABLED", enabled)
    monkeypatch.setattr(pdl, "_capable", lambda index: capability >= 9)
    if interpret is None:
        monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    else:
        monkeypatch.setenv("TRITON_INTERPRET", interpret)
    assert pdl.pdl_launch(types.SimpleNamespace(is_cuda=True, device=_FakeCuda.device)) == expected
    assert pdl.pdl_launch(torch.zeros(1)) == {"PDL": False}  # a CPU tensor never
    # a prefetching GEMV also names PREFETCH, off without PDL (torch.compile's launchers
    # need every constexpr named)
    with_prefetch = pdl.pdl_launch(
        types.SimpleNamespace(is_cuda=True, device=_FakeCuda.device), prefetch=True
    )
    assert with_prefetch == {**expected, "PREFETCH": expected["PDL"] and pdl.PREFETCH}
