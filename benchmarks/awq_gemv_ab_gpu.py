"""A/B of the AWQ decode GEMV on a GPU: this tree's kernel against another version of
``engine_awq/gemv.py`` (``--before FILE``, e.g. ``git show REV:plugins/awq/engine_awq/
gemv.py > /tmp/before.py``, or an experimental variant), same tiles (the tree's tuned
table for the GPU, else the default rule), each call timed inside a CUDA graph over weight
copies that do not fit in L2 (``quant_gemv_gpu.Timer``), and both outputs checked against
the float32 dequantized reference.

    python3 benchmarks/awq_gemv_ab_gpu.py --before FILE [--models ...] [--out F.json]
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).parent))
from quant_gemv_gpu import GROUP, SHAPES, Projection, Timer  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default="Llama-3.1-8B,Qwen3-0.6B")
    parser.add_argument("--tokens", type=int, default=1)
    parser.add_argument("--out", type=Path)
    parser.add_argument("--before", type=Path, required=True, help="the earlier gemv.py")
    args = parser.parse_args()
    spec = importlib.util.spec_from_file_location("awq_gemv_before", args.before)
    assert spec is not None and spec.loader is not None
    before = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(before)
    from engine_awq import gemv as after

    device = torch.device("cuda")
    timer, rows = Timer(device), []
    print(torch.cuda.get_device_name(), flush=True)
    print(f"{'model':14s} {'proj':8s} {'before ms':>10s} {'after ms':>10s} {'after/before':>12s}"
          f" {'GB/s after':>10s} {'rel err before/after':>22s}", flush=True)  # fmt: skip
    with torch.inference_mode():
        for model in args.models.split(","):
            for name, (num_out, num_in) in SHAPES[model].items():
                p = Projection(num_out, num_in, device)
                chunk = p.awq[3]
                config = after.gemv_config(device, args.tokens, num_out, num_in, chunk)
                old_config = before.GemvConfig(*config)
                x = torch.randn(args.tokens, num_in, device=device).to(torch.bfloat16)
                want = x.float() @ p.refs["awq"].t()
                row = {"model": model, "proj": name, "config": config._asdict()}
                for label, mod, cfg in (("before", before, old_config), ("after", after, config)):
                    calls = [
                        (lambda t=t, lk=lk, mod=mod, cfg=cfg, x=x, c=chunk: mod.awq_gemv(
                            x, *t, GROUP, c, None, cfg, lk))
                        for t, lk in p.copies("awq")
                    ]  # fmt: skip
                    ms, outs = timer(calls)
                    err = float((outs[-1].float() - want).abs().max() / want.abs().max())
                    row[f"{label}_ms"], row[f"{label}_rel_err"] = ms, err
                    timer.graphs.clear()
                gbs = p.nbytes["awq"] / row["after_ms"] / 1e6
                ratio = row["after_ms"] / row["before_ms"]
                errs = f"{row['before_rel_err']:10.2e}/{row['after_rel_err']:.2e}"
                print(f"{model:14s} {name:8s} {row['before_ms']:10.5f} {row['after_ms']:10.5f} "
                      f"{ratio:12.3f} {gbs:10.0f} {errs}", flush=True)  # fmt: skip
                rows.append(row)
                del p
                torch.cuda.empty_cache()
                if args.out:
                    args.out.write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
