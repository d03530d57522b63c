"""The decode GEMVs' machine code without a GPU: compile the W4A16 / W8A16 kernels for sm_90
with Triton's compiler and ``ptxas`` (both ship in the triton wheel) and report registers,
spills, shared memory and the instructions the main loop issues per weight, next to the
previous kernels (``engine_awq.w4a16``, ``engine_fp8.w8a16``).

    python3 benchmarks/quant_gemv_sass.py          # the default tiles
    python3 benchmarks/quant_gemv_sass.py --loop   # and the main loop's opcode counts

Instruction counts are a model, not a measurement: issue is 4 warp instructions a cycle
per multiprocessor, so a 4-bit GEMV at ``i`` instructions a weight cannot read more than
``128 / i / 2`` bytes a cycle per multiprocessor, whatever the memory does.
"""

from __future__ import annotations

import argparse
import collections
import re
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
for _folder in ("plugins/fp8", "plugins/awq", "core", "sdk"):
    sys.path.insert(0, str(REPO / _folder))

import triton  # noqa: E402
from triton.backends.compiler import GPUTarget  # noqa: E402
from triton.compiler import ASTSource  # noqa: E402

BIN = Path(triton.__file__).parent / "backends" / "nvidia" / "bin"
_INSTR = re.compile(r"\s+/\*([0-9a-f]{4})\*/\s+(@!?U?P\w+\s+)?([A-Z0-9_.]+)")
_BRANCH = re.compile(r"BRA\s+(?:`?\(?\.L_x_\d+\)?|0x([0-9a-f]+))")

# Kernel arguments: (type, 16-divisible), as the launcher specializes real calls.
_COMMON = {"bias_ptr": ("*bf16", 1), "out_ptr": ("*bf16", 1), "M": ("i32", 0),
           "N": ("i32", 1), "stride_xm": ("i32", 1), "stride_om": ("i32", 1)}  # fmt: skip
AWQ_GEMV_ARGS = {**_COMMON, "x_ptr": ("*bf16", 1), "qw_ptr": ("*i32", 1), "z_ptr": ("*u8", 1),
                 "s_ptr": ("*fp16", 1), "part_ptr": ("*fp32", 1), "lock_ptr": ("*i32", 1),
                 "num_chunks": ("i32", 1), "chunks_per_split": ("i32", 0),
                 "num_splits": ("i32", 0), "stride_qw": ("i32", 1), "stride_z": ("i32", 1),
                 "stride_s": ("i32", 1), "magic": ("i32", 0)}  # fmt: skip
AWQ_OLD_ARGS = {**_COMMON, "x_ptr": ("*bf16", 1), "qw_ptr": ("*i32", 1), "z_ptr": ("*u8", 1),
                "s_ptr": ("*fp16", 1), "out_ptr": ("*fp32", 1), "num_chunks": ("i32", 1),
                "chunks_per_split": ("i32", 0), "stride_qw": ("i32", 1),
                "stride_z": ("i32", 1), "stride_s": ("i32", 1),
                "stride_op": ("i32", 1)}  # fmt: skip
FP8_GEMV_ARGS = {**_COMMON, "x_ptr": ("*bf16", 1), "w_ptr": ("*fp8e4nv", 1),
                 "s_ptr": ("*fp32", 1), "part_ptr": ("*fp32", 1), "lock_ptr": ("*i32", 1),
                 "K": ("i32", 1), "steps_per_split": ("i32", 0), "num_splits": ("i32", 0),
                 "stride_wn": ("i32", 1), "stride_sn": ("i32", 0),
                 "stride_sk": ("i32", 0)}  # fmt: skip
_NO_BIAS = {k: v for k, v in _COMMON.items() if k != "bias_ptr"}
AWQ_ROWS_ARGS = {**_NO_BIAS, "x_ptr": ("*bf16", 1), "r_ptr": ("*bf16", 1), "nw_ptr": ("*bf16", 1),
                 "qw_ptr": ("*i32", 1), "z_ptr": ("*u8", 1), "s_ptr": ("*fp16", 1),
                 "b_ptr": ("*fp16", 1), "res_ptr": ("*bf16", 1), "num_chunks": ("i32", 1),
                 "eps": ("fp32", 0), "stride_qw": ("i32", 1), "stride_z": ("i32", 1),
                 "stride_s": ("i32", 1), "magic": ("i32", 0)}  # fmt: skip
AWQ_WIDE_ARGS = {
    k: v for k, v in AWQ_ROWS_ARGS.items() if k not in ("M", "stride_xm", "stride_om", "magic")
}
FP8_OLD_ARGS = {**FP8_GEMV_ARGS, "out_ptr": ("*fp32", 1), "stride_op": ("i32", 1)}
for _name in ("part_ptr", "lock_ptr", "num_splits"):
    FP8_OLD_ARGS.pop(_name)


def compile_sm90(fn: Any, args: dict[str, tuple[str, int]], constexprs: dict[str, Any],
                 num_warps: int) -> Any:  # fmt: skip
    """``fn`` compiled for sm_90 (no GPU needed)."""
    names = fn.arg_names
    signature = {name: args[name][0] for name in names if name in args}
    signature.update({name: "constexpr" for name in constexprs})
    attrs = {(names.index(n),): [["tt.divisibility", 16]] for n, (_, d) in args.items() if d}
    src = ASTSource(fn=fn, signature=signature, constexprs=constexprs, attrs=attrs)
    return triton.compile(src, target=GPUTarget("cuda", 90, 32), options={"num_warps": num_warps})


def inspect(compiled: Any) -> dict[str, Any]:
    """Registers, spill stack, shared memory and the largest loop's opcode counts."""
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(compiled.asm["cubin"])
        f.flush()
        usage = subprocess.run([str(BIN / "cuobjdump"), "--dump-resource-usage", f.name],
                               capture_output=True, text=True, check=True).stdout  # fmt: skip
        sass = subprocess.run([str(BIN / "cuobjdump"), "-sass", f.name],
                              capture_output=True, text=True, check=True).stdout  # fmt: skip
    found = re.search(r"REG:(\d+) STACK:(\d+)", usage)
    assert found, usage
    instrs = [(int(m.group(1), 16), m.group(3), line) for line in sass.splitlines()
              if (m := _INSTR.match(line))]  # fmt: skip
    loop = (0, -1)
    for addr, _, line in instrs:
        branch = _BRANCH.search(line)
        if branch and branch.group(1) and int(branch.group(1), 16) < addr:
            start = int(branch.group(1), 16)
            loop = max(loop, (start, addr), key=lambda span: span[1] - span[0])
    body = collections.Counter(op for addr, op, _ in instrs if loop[0] <= addr <= loop[1])
    return {"regs": int(found.group(1)), "stack": int(found.group(2)),
            "shared": compiled.metadata.shared, "loop": body}  # fmt: skip


def kernels() -> list[tuple[str, Any, dict[str, Any], dict[str, Any], int, float]]:
    """(label, kernel, args, constexprs, warps, weights a thread handles per loop step)."""
    from engine_awq import gemv as awq_gemv
    from engine_awq import rows, w4a16
    from engine_fp8 import gemv as fp8_gemv
    from engine_fp8 import w8a16

    out = []
    for block_n, block_c, warps in ((4, 16, 4), (8, 8, 4), (4, 8, 4), (2, 8, 4)):
        ce = {"GROUP": 128, "CHUNK": 128, "NPG": 8, "BLOCK_M": 1, "BLOCK_N": block_n,
              "BLOCK_C": block_c, "HAS_BIAS": False}  # fmt: skip
        per_step = block_n * block_c * 128 / (32 * warps)
        out.append((f"awq rows {block_n}x{block_c * 128} {warps}w 1 tok", rows.awq_rows_kernel,
                    AWQ_ROWS_ARGS, ce, warps, per_step))  # fmt: skip
    from engine_awq import wide

    for block_n, block_c, warps, gated in ((8, 32, 2, False), (4, 32, 2, True), (16, 16, 1, False)):
        ce = {"GROUP": 128, "CHUNK": 128, "NPG": 8, "BLOCK_N": block_n, "BLOCK_C": block_c,
              "HAS_BIAS": False, "NORM": gated, "NORM_K": 4096, "GATED": gated}  # fmt: skip
        rows_a_program = block_n * (2 if gated else 1)
        per_step = rows_a_program * block_c * 128 / (32 * warps)
        label = f"awq wide {block_n}x{block_c * 128} {warps}w{' gated' if gated else ''}"
        out.append((label, wide.awq_wide_kernel, AWQ_WIDE_ARGS, ce, warps, per_step))
    for tokens in (1, 16):
        cfg = awq_gemv.default_gemv_config(tokens, 4096, 128)
        block_m = 16 if cfg.variant == "dot" else 1
        ce = {"GROUP": 128, "CHUNK": 128, "NPG": 8, "BLOCK_M": block_m, "BLOCK_N": cfg.block_n,
              "NUM_STAGES": cfg.num_stages, "USE_DOT": cfg.variant == "dot", "HAS_BIAS": False,
              "SPLIT": True}  # fmt: skip
        per_step = cfg.block_n * 16 * 8 / (32 * cfg.num_warps)  # a chunk: BLOCK_N x 128 K
        out.append((f"awq gemv {cfg.variant} {tokens} tok", awq_gemv._gemv_kernel,
                    AWQ_GEMV_ARGS, ce, cfg.num_warps, per_step))  # fmt: skip
        old = w4a16.default_config(tokens, 4096, 128, "fma" if tokens <= 4 else "dot")
        ce = {"GROUP": 128, "CHUNK": 128, "BLOCK_M": old.block_m, "BLOCK_N": old.block_n,
              "USE_DOT": old.variant == "dot", "HAS_BIAS": False, "SPLIT": True}  # fmt: skip
        per_step = old.block_n * 16 * 8 / (32 * old.num_warps)
        out.append((f"awq old {old.variant} {tokens} tok", w4a16._w4a16_kernel, AWQ_OLD_ARGS,
                    ce, old.num_warps, per_step))  # fmt: skip
        f = fp8_gemv.default_gemv_config(tokens, 4096)
        ce = {"SCALE": 1, "SCALE_ROWS": 1, "SCALE_COLS": 1, "BLOCK_M": 16 if f.variant == "dot"
              else 1, "BLOCK_N": f.block_n, "BLOCK_K": f.block_k, "NUM_STAGES": f.num_stages,
              "USE_DOT": f.variant == "dot", "HAS_BIAS": False, "SPLIT": True}  # fmt: skip
        per_step = f.block_n * f.block_k / (32 * f.num_warps)
        out.append((f"fp8 gemv {f.variant} {tokens} tok", fp8_gemv._gemv_kernel, FP8_GEMV_ARGS,
                    ce, f.num_warps, per_step))  # fmt: skip
        old8 = w8a16.default_config(tokens, 4096, "fma" if tokens <= 4 else "dot")
        ce = {"SCALE": 1, "SCALE_ROWS": 1, "SCALE_COLS": 1, "BLOCK_M": old8.block_m,
              "BLOCK_N": old8.block_n, "BLOCK_K": old8.block_k, "USE_DOT": old8.variant == "dot",
              "HAS_BIAS": False, "SPLIT": True}  # fmt: skip
        per_step = old8.block_n * old8.block_k / (32 * old8.num_warps)
        out.append((f"fp8 old {old8.variant} {tokens} tok", w8a16._w8a16_kernel, FP8_OLD_ARGS,
                    ce, old8.num_warps, per_step))  # fmt: skip
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--loop", action="store_true", help="print the main loop's opcodes")
    args = parser.parse_args()
    print("kernel (N 4096, K 4096, bf16)   regs  spill  shared  loop instrs  per weight")
    for label, fn, kargs, ce, warps, per_step in kernels():
        info = inspect(compile_sm90(fn, kargs, ce, warps))
        total = sum(info["loop"].values())
        print(f"{label:<32} {info['regs']:>4}  {info['stack']:>5}  {info['shared']:>6}  "
              f"{total:>11}  {total / per_step:>10.2f}")  # fmt: skip
        if args.loop:
            print("    " + " ".join(f"{k}:{v}" for k, v in info["loop"].most_common(16)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
