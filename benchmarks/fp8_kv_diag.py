"""Why the Triton fp8-KV attention is off by 2-3 bf16 ulps with bf16 queries (GPU only).

1. Conversion check: every e4m3fn byte converted by Triton to bf16 / fp16 / fp32 against
   torch's exact conversion (a wrong fast path would show here).
2. The fp8 conformance cases in bf16 and fp16 (max abs error, no tolerance) for the
   installed kernels and for a variant whose fp8 tiles go through fp32 before the dots.

    python3 benchmarks/fp8_kv_diag.py --out diag.json
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import torch
import triton
import triton.language as tl


@triton.jit
def _convert(src_ptr, bf16_ptr, f16_ptr, f32_ptr, N: tl.constexpr):
    offs = tl.arange(0, N)
    x = tl.load(src_ptr + offs)
    tl.store(bf16_ptr + offs, x.to(tl.bfloat16))
    tl.store(f16_ptr + offs, x.to(tl.float16))
    tl.store(f32_ptr + offs, x.to(tl.float32))


def conversion_check() -> dict[str, int]:
    raw = torch.arange(256, dtype=torch.uint8, device="cuda")
    fp8 = raw.view(torch.float8_e4m3fn)
    finite = ~torch.isnan(fp8.float())
    outs = {dt: torch.empty(256, dtype=dt, device="cuda")
            for dt in (torch.bfloat16, torch.float16, torch.float32)}  # fmt: skip
    _convert[(1,)](fp8, outs[torch.bfloat16], outs[torch.float16], outs[torch.float32], N=256)
    result = {}
    for dt, got in outs.items():
        want = fp8.to(dt)
        bad = (got.float() != want.float()) & finite
        result[str(dt)] = int(bad.sum())
        if bad.any():
            idx = bad.nonzero().flatten()[:8].tolist()
            pairs = [(hex(i), float(want[i]), float(got[i])) for i in idx]
            print(f"  {dt}: {int(bad.sum())} wrong, e.g. (byte, want, got) {pairs}")
    return result


CASE_SCRIPT = r"""
import json, sys, torch
from engine_sdk.testing.attention import FP8_ATTENTION_CASES, run_attention_case
from engine_triton.backend import TritonAttentionBackend
out = {}
for case in FP8_ATTENTION_CASES:
    for dt in (torch.bfloat16, torch.float16):
        try:
            run_attention_case(TritonAttentionBackend, case, device="cuda", dtype=dt, tolerance=0.0)
            err = 0.0
        except AssertionError as e:
            err = float(str(e).split("max abs error ")[1].split(" ")[0])
        out[f"{case.name}/{str(dt)[6:]}"] = err
print(json.dumps(out))
"""


def run_cases(pythonpath_first: str | None) -> dict[str, float]:
    import os

    env = dict(os.environ)
    if pythonpath_first:
        env["PYTHONPATH"] = pythonpath_first + ":" + env.get("PYTHONPATH", "")
    done = subprocess.run([sys.executable, "-c", CASE_SCRIPT], capture_output=True, text=True,
                          env=env, timeout=300)  # fmt: skip
    if done.returncode != 0:
        print(done.stderr[-3000:])
        return {}
    result: dict[str, float] = json.loads(done.stdout.strip().splitlines()[-1])
    return result


def variant_via_fp32(tmp: Path) -> str:
    """A copy of engine_triton whose fp8 tiles are converted through fp32."""
    import engine_triton

    src = Path(engine_triton.__file__).parent
    dst = tmp / "engine_triton"
    shutil.copytree(src, dst)
    kernels = dst / "kernels.py"
    text = kernels.read_text()
    replaced = text.replace("tl.trans(k).to(q.dtype)", "tl.trans(k.to(tl.float32)).to(q.dtype)")
    replaced = replaced.replace("v.to(q.dtype)", "v.to(tl.float32).to(q.dtype)")
    assert replaced != text, "kernel source changed: update the variant"
    kernels.write_text(replaced)
    return str(tmp)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    print(torch.cuda.get_device_name(), "triton", triton.__version__)
    report: dict[str, object] = {"conversion_mismatches": conversion_check()}
    print("conversion mismatches:", report["conversion_mismatches"])
    report["cases_installed"] = run_cases(None)
    with tempfile.TemporaryDirectory() as tmp:
        report["cases_via_fp32"] = run_cases(variant_via_fp32(Path(tmp)))
    for name in report["cases_installed"]:  # type: ignore[union-attr]
        a = report["cases_installed"][name]  # type: ignore[index]
        b = report["cases_via_fp32"].get(name)  # type: ignore[union-attr]
        print(f"  {name:40s} installed {a:.4g}  via fp32 {b}")
    args.out.write_text(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
