"""Where W4's time goes (nano-vllm: 256 sequences, 100-1024 tokens in and out).

    python3 benchmarks/w4_profile_gpu.py --model DIR [--out FILE.json] [--no-profiler]

Two runs of the W4 requests through the offline ``LLM`` (the same requests and sampling as
``engine bench throughput --dataset-name nano-vllm --temperature 0.6``), after a warm-up:

1. **Step timeline** (no profiler; ``--runs`` times, to tell first-use costs such as
   kernel compiles from the steady state): every engine step's wall time, attributed to the step
   it waited for, bucketed by what that step ran: prefill (any prompt tokens) or decode
   at batch 1-16, 17-64, 65-128 and 129-256. Sum of wall time, steps, and output tokens
   per bucket: which part of the run sets its length.
2. **Kernels** (torch.profiler, unless ``--no-profiler``): device time by kernel family
   (attention, GEMM/GEMV, norms and rope, sampling, copies, other), the top kernels, and
   the idle time between kernels (short gaps inside graphs and streams, long gaps where
   the device waited for the host).
"""

from __future__ import annotations

import argparse
import collections
import json
import time
from pathlib import Path
from typing import Any

import torch
from engine import LLM, SamplingParams
from engine.benchmarks.datasets import nano_vllm_requests
from engine.core import engine_core
from profile_kernels_gpu import gaps
from torch.profiler import ProfilerActivity, profile

BUCKETS = ((1, 16), (17, 64), (65, 128), (129, 256), (257, 1 << 30))
FAMILIES = (  # (family, substrings of the kernel name), first match wins
    ("attention", ("attention", "attn", "combine_splits", "flash")),
    ("gemm", ("gemm", "gemv", "nvjet", "cutlass", "sm90", "cublas", "matmul", "splitk")),
    ("norm_rope", ("norm", "rope", "rotary")),
    ("act", ("silu", "act_and_mul", "gelu")),
    ("sampling", ("sample", "argmax", "softmax", "topk", "top_k", "sort", "exponential")),
    ("copy", ("copy", "memcpy", "memset", "cat", "index", "scatter", "gather", "fill")),
)


def family(name: str) -> str:
    low = name.lower()
    for fam, keys in FAMILIES:
        if any(k in low for k in keys):
            return fam
    return "other"


class StepTimeline:
    """Wraps ``EngineCore._step``: for each call, the wall time since the previous call
    returned, charged to the step launched by the previous call (async: the one this call
    waited for) or to this call's step (sync)."""

    def __init__(self) -> None:
        self.rows: list[tuple[float, int, int, int]] = []  # seconds, seqs, tokens, prefill
        self._last = 0.0
        self._pending: tuple[int, int, int] | None = None
        self.original = engine_core.EngineCore._step
        timeline = self

        def _step(core: Any) -> Any:
            scheduled: list[Any] = []
            real = core.scheduler.schedule

            def schedule() -> Any:
                out = real()
                scheduled.append(out)
                return out

            core.scheduler.schedule = schedule
            try:
                result = timeline.original(core)
            finally:
                del core.scheduler.schedule
            now = time.perf_counter()
            comp = None
            if scheduled and not scheduled[0].is_empty:
                s = scheduled[0].scheduled
                prefill = sum(r.num_tokens for r in s if r.num_tokens > 1 or not r.sample)
                comp = (len(s), scheduled[0].num_scheduled_tokens, prefill)
            charged = timeline._pending if core.async_scheduling else comp
            if charged is not None and timeline._last:
                timeline.rows.append((now - timeline._last, *charged))
            timeline._pending = comp
            timeline._last = now
            return result

        engine_core.EngineCore._step = _step  # type: ignore[method-assign]

    def reset(self) -> None:
        """Forget the rows so far (before a timed run)."""
        self.rows.clear()
        self._last = 0.0

    def summary(self) -> list[dict[str, Any]]:
        acc: dict[str, list[float]] = collections.defaultdict(lambda: [0.0, 0, 0, 0])
        for seconds, seqs, tokens, prefill in self.rows:
            if prefill:
                key = "prefill (any prompt tokens)"
            else:
                lo, hi = next(b for b in BUCKETS if b[0] <= seqs <= b[1])
                key = f"decode batch {lo}-{hi}"
            acc[key][0] += seconds
            acc[key][1] += 1
            acc[key][2] += seqs
            acc[key][3] += tokens
        total = sum(v[0] for v in acc.values()) or 1.0
        return [
            {"bucket": k, "seconds": v[0], "share": v[0] / total, "steps": v[1],
             "ms_per_step": 1000 * v[0] / max(v[1], 1), "seqs_per_step": v[2] / max(v[1], 1),
             "tokens_per_step": v[3] / max(v[1], 1)}
            for k, v in sorted(acc.items())
        ]  # fmt: skip


def sync() -> None:
    if torch.cuda.is_available():
        torch.cuda.synchronize()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", required=True)
    parser.add_argument("--out", type=Path)
    parser.add_argument("--no-profiler", action="store_true")
    parser.add_argument("--sync", action="store_true", help="--no-async-scheduling")
    parser.add_argument("--num-seqs", type=int, default=256)
    parser.add_argument("--max-len", type=int, default=1024, help="longest prompt and output")
    parser.add_argument("--runs", type=int, default=2, help="timeline runs (then the profiler)")
    parser.add_argument("--no-prefix-caching", action="store_true")
    args = parser.parse_args()
    timeline = StepTimeline()
    llm = LLM(
        args.model,
        load_format="dummy",
        dtype="bfloat16",
        max_model_len=4096,
        async_scheduling=not args.sync,
        enable_prefix_caching=not args.no_prefix_caching,
    )
    requests = nano_vllm_requests(args.num_seqs, args.max_len, args.max_len)
    prompts = [{"prompt_token_ids": r.prompt_token_ids} for r in requests]
    params = [
        SamplingParams(temperature=0.6, max_tokens=r.output_len, ignore_eos=True) for r in requests
    ]
    out_tokens = sum(r.output_len for r in requests)
    warm = [{"prompt_token_ids": r.prompt_token_ids[::-1]} for r in requests[:16]]
    llm.generate(warm, params[:16], use_tqdm=False)  # warm-up (other prompts: no cache hits)
    report: dict[str, Any] = {"model": args.model, "async_scheduling": not args.sync}
    report["prefix_caching"] = not args.no_prefix_caching
    report["runs"] = []
    for run in range(args.runs):
        sync()
        timeline.reset()
        start = time.perf_counter()
        llm.generate(prompts, params, use_tqdm=False)
        wall = time.perf_counter() - start
        rows = list(timeline.rows)
        record = {
            "wall_s": wall,
            "output_tokens_per_s": out_tokens / wall,
            "steps": len(rows),
            "buckets": timeline.summary(),
            "prefill_steps_ms": [(round(1000 * r[0], 2), *r[1:]) for r in rows if r[3]],
            "slowest_steps_ms": sorted((round(1000 * r[0], 2), *r[1:]) for r in rows)[-8:],
        }
        report["runs"].append(record)
        print(f"W4 run {run}: wall {wall:.2f} s, {out_tokens / wall:,.0f} output tok/s, "
              f"{len(rows)} steps")  # fmt: skip
        for b in record["buckets"]:
            print(f"  {b['bucket']:28s} {b['seconds']:6.2f} s {100 * b['share']:5.1f}% "
                  f"{b['steps']:5d} steps {b['ms_per_step']:7.3f} ms/step "
                  f"{b['seqs_per_step']:6.1f} seqs {b['tokens_per_step']:7.1f} tokens")  # fmt: skip
        print("  prefill steps (ms, seqs, tokens, prompt tokens):", record["prefill_steps_ms"])
        print("  slowest steps:", record["slowest_steps_ms"])
    if not args.no_profiler:
        sync()
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            start = time.perf_counter()
            llm.generate(prompts, params, use_tqdm=False)
            sync()
            prof_wall = time.perf_counter() - start
        kernels: dict[str, list[float]] = collections.defaultdict(list)
        spans: list[tuple[float, float]] = []
        for event in prof.events():
            if event.device_type == torch.autograd.DeviceType.CUDA:
                kernels[event.name].append(event.device_time_total)
                spans.append((event.time_range.start, event.time_range.end))
        fams: dict[str, float] = collections.defaultdict(float)
        for name, times in kernels.items():
            fams[family(name)] += sum(times)
        idle = gaps(spans, 10.0)
        busy = sum(fams.values())
        report["profiled_wall_s"] = prof_wall
        report["device_busy_s"] = busy / 1e6
        report["families_s"] = {k: v / 1e6 for k, v in sorted(fams.items(), key=lambda x: -x[1])}
        report["idle_s"] = {k: v / 1e6 for k, v in idle.items() if k.endswith("_us")}
        report["top"] = [
            {"name": n[:110], "count": len(v), "s": sum(v) / 1e6, "us_mean": sum(v) / len(v)}
            for n, v in sorted(kernels.items(), key=lambda kv: -sum(kv[1]))[:25]
        ]
        print(f"profiled: wall {prof_wall:.2f} s, device busy {busy / 1e6:.2f} s, "
              f"idle short {idle['short_gap_us'] / 1e6:.2f} s, long "
              f"{idle['long_gap_us'] / 1e6:.2f} s ({idle['long_gaps']} gaps)")  # fmt: skip
        for k, v in report["families_s"].items():
            print(f"  {k:10s} {v:6.3f} s")
        for r in report["top"]:
            print(f"  {r['s']:7.3f} s {r['count']:7d}x {r['us_mean']:8.2f} us  {r['name']}")
    if args.out:
        args.out.write_text(json.dumps(report, indent=1))


if __name__ == "__main__":
    main()
