"""Kernel-level profile of batch-1 decode (W2's shape): which kernels a step launches,
how long each takes on the device, and where the device sits idle between them.

    python3 benchmarks/profile_kernels_gpu.py --model DIR [--out FILE.json] [--sync]

Uses torch.profiler around one ``generate`` of ``--tokens`` tokens after a warm-up (CUDA
graphs replay as one launch; their kernels still appear individually). Prints the top
kernels by total device time, kernels per decode step, device-busy time per token, wall
time per token, and the idle time between consecutive kernels split into short gaps (at
most ``--short-gap-us``: launch latency inside a graph or a queued stream) and long gaps
(the device waited for the host).
"""

from __future__ import annotations

import argparse
import cProfile
import io
import json
import pstats
import time
from pathlib import Path

import torch
from engine import LLM, SamplingParams
from torch.profiler import ProfilerActivity, profile


def gaps(spans: list[tuple[float, float]], short_us: float) -> dict[str, float]:
    """Idle device time between kernels (us, summed), short and long gaps apart."""
    spans.sort()
    short = long = 0.0
    n_long = 0
    end = spans[0][1]
    for start, stop in spans[1:]:
        idle = start - end
        if idle > 0:
            if idle <= short_us:
                short += idle
            else:
                long += idle
                n_long += 1
        end = max(end, stop)
    return {"short_gap_us": short, "long_gap_us": long, "long_gaps": n_long}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--model", required=True)
    parser.add_argument("--out", type=Path)
    parser.add_argument("--tokens", type=int, default=128)
    parser.add_argument("--sync", action="store_true", help="--no-async-scheduling")
    parser.add_argument("--short-gap-us", type=float, default=10.0)
    parser.add_argument("--quantization", default=None)
    parser.add_argument(
        "--max-num-seqs", type=int, default=256, help="fewer: fewer CUDA graphs to capture"
    )
    parser.add_argument(
        "--cprofile",
        type=int,
        default=0,
        help="also print the top N host functions (cProfile of another generate, by own time)",
    )
    args = parser.parse_args()
    llm = LLM(
        args.model,
        load_format="dummy",
        dtype="bfloat16",
        gpu_memory_utilization=0.5,
        async_scheduling=not args.sync,
        quantization=args.quantization,
        max_num_seqs=args.max_num_seqs,
    )
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
    spans: list[tuple[float, float]] = []
    for event in prof.events():
        if event.device_type == torch.autograd.DeviceType.CUDA:
            kernels.setdefault(event.name, []).append(event.device_time_total)
            spans.append((event.time_range.start, event.time_range.end))
    busy_us = sum(sum(v) for v in kernels.values())
    rows = sorted(kernels.items(), key=lambda kv: -sum(kv[1]))
    idle = gaps(spans, args.short_gap_us)
    per = args.tokens
    report = {
        "model": args.model,
        "async_scheduling": not args.sync,
        "quantization": args.quantization,
        "tokens": per,
        "wall_ms_per_token": 1000 * wall / per,
        "device_busy_ms_per_token": busy_us / 1000 / per,
        "short_gap_ms_per_token": idle["short_gap_us"] / 1000 / per,
        "long_gap_ms_per_token": idle["long_gap_us"] / 1000 / per,
        "long_gaps_per_token": idle["long_gaps"] / per,
        "kernels_per_token": sum(len(v) for v in kernels.values()) / per,
        "top": [
            {"name": n[:110], "count_per_token": len(v) / per,
             "us_per_token": sum(v) / per, "us_mean": sum(v) / len(v)}
            for n, v in rows[:30]
        ],
    }  # fmt: skip
    print(f"{args.model} async={not args.sync} quant={args.quantization}: "
          f"wall {report['wall_ms_per_token']:.3f} ms/token, device busy "
          f"{report['device_busy_ms_per_token']:.3f}, short gaps "
          f"{report['short_gap_ms_per_token']:.3f}, long gaps "
          f"{report['long_gap_ms_per_token']:.3f} ({report['long_gaps_per_token']:.1f}/token), "
          f"{report['kernels_per_token']:.0f} kernels/token")  # fmt: skip
    for r in report["top"]:
        print(f"{r['us_per_token']:8.1f} us/tok {r['count_per_token']:6.1f}x "
              f"{r['us_mean']:7.2f} us  {r['name']}")  # fmt: skip
    if args.cprofile:
        host = cProfile.Profile()
        host.enable()
        llm.generate([prompt], params, use_tqdm=False)
        torch.cuda.synchronize()
        host.disable()
        text = io.StringIO()
        pstats.Stats(host, stream=text).sort_stats("tottime").print_stats(args.cprofile)
        report["cprofile"] = text.getvalue()
        print(report["cprofile"])
    if args.out:
        args.out.write_text(json.dumps(report, indent=1))


if __name__ == "__main__":
    main()
