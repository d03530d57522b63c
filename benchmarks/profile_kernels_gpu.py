"""Kernel-level profile of batch-1 decode (W2's shape): which kernels a step launches,
how long each takes on the device, and how busy the device is over the step's wall time.

    python3 benchmarks/profile_kernels_gpu.py --model DIR [--out FILE.json]

Uses torch.profiler around one ``generate`` of 128 tokens after a warm-up (CUDA graphs
replay as one launch; their kernels still appear individually). Prints the top kernels
by total device time, kernels per decode step, device-busy time per token and wall time
per token.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import torch
from engine import LLM, SamplingParams
from torch.profiler import ProfilerActivity, profile


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--model", required=True)
    parser.add_argument("--out", type=Path)
    parser.add_argument("--tokens", type=int, default=128)
    args = parser.parse_args()
    llm = LLM(args.model, load_format="dummy", dtype="bfloat16", gpu_memory_utilization=0.5)
    params = SamplingParams(temperature=0.0, max_tokens=args.tokens, ignore_eos=True)
    prompt = {"prompt_token_ids": list(range(100, 228))}
    llm.generate([prompt], params, use_tqdm=False)  # warm-up
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        start = time.perf_counter()
        llm.generate([prompt], params, use_tqdm=False)
        torch.cuda.synchronize()
        wall = time.perf_counter() - start
    kernels: dict[str, list[float]] = {}
    for event in prof.events():
        if event.device_type == torch.autograd.DeviceType.CUDA:
            kernels.setdefault(event.name, []).append(event.device_time_total)
    busy_us = sum(sum(v) for v in kernels.values())
    rows = sorted(kernels.items(), key=lambda kv: -sum(kv[1]))
    report = {
        "tokens": args.tokens,
        "wall_ms_per_token": 1000 * wall / args.tokens,
        "device_busy_ms_per_token": busy_us / 1000 / args.tokens,
        "kernels_per_token": sum(len(v) for v in kernels.values()) / args.tokens,
        "top": [
            {"name": n[:90], "count_per_token": len(v) / args.tokens,
             "us_per_token": sum(v) / args.tokens, "us_mean": sum(v) / len(v)}
            for n, v in rows[:25]
        ],
    }  # fmt: skip
    print(f"wall {report['wall_ms_per_token']:.3f} ms/token, device busy "
          f"{report['device_busy_ms_per_token']:.3f} ms/token, "
          f"{report['kernels_per_token']:.0f} kernels/token")  # fmt: skip
    for r in report["top"]:
        print(f"{r['us_per_token']:8.1f} us/tok {r['count_per_token']:6.1f}x "
              f"{r['us_mean']:7.2f} us  {r['name']}")  # fmt: skip
    if args.out:
        args.out.write_text(json.dumps(report, indent=1))


if __name__ == "__main__":
    main()
