"""Where one engine step's time goes on the GPU: host phases versus device time.

Wraps the scheduler, the runner and the output processor of a live ``LLM`` with timers
(synchronising the device around the runner), runs a batch-1 decode and a batch-256
decode, and prints milliseconds per step for each phase. Diagnostic, not a benchmark.
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

TIMES: dict[str, list[float]] = collections.defaultdict(list)


def timed(name: str, fn: Any, sync: bool = False) -> Any:
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        if sync and torch.cuda.is_available():
            torch.cuda.synchronize()
        start = time.perf_counter()
        out = fn(*args, **kwargs)
        if sync and torch.cuda.is_available():
            torch.cuda.synchronize()
        TIMES[name].append(time.perf_counter() - start)
        return out

    return wrapper


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--model", required=True)
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    llm = LLM(model=args.model, load_format="dummy", dtype="bfloat16")
    eng = llm.engine
    core = eng.engine_core
    runner = core.runner
    print("cuda graphs:", runner.cuda_graphs is not None, flush=True)
    sched = core.scheduler
    sched.schedule = timed("schedule", sched.schedule)
    sched.update_from_output = timed("update_from_output", sched.update_from_output)
    runner.prepare_inputs = timed("prepare_inputs", runner.prepare_inputs)
    runner.run_model = timed("run_model_eager", runner.run_model, sync=True)
    if runner.cuda_graphs is not None:
        runner.cuda_graphs.run = timed("graph_run", runner.cuda_graphs.run, sync=True)
    runner.sample = timed("sample", runner.sample, sync=True)
    runner.execute = timed("execute_total", runner.execute)
    eng.output_processor.process_outputs = timed(
        "process_outputs", eng.output_processor.process_outputs
    )
    eng.step = timed("llm_engine_step", eng.step)
    report = {}
    for batch, in_len, out_len in ((1, 128, 128), (256, 512, 64)):
        TIMES.clear()
        vocab = min(9000, eng.vocab_size - 1)
        prompts = [{"prompt_token_ids": [(i * 7 + j) % vocab for j in range(in_len)]}
                   for i in range(batch)]  # fmt: skip
        params = SamplingParams(temperature=0.0, max_tokens=out_len, ignore_eos=True)
        start = time.perf_counter()
        llm.generate(prompts, params, use_tqdm=False)
        wall = time.perf_counter() - start
        rows = {k: (1000 * sum(v) / len(v), len(v)) for k, v in TIMES.items()}
        report[f"batch{batch}"] = {"wall_s": wall, "ms_per_call": rows}
        print(f"batch {batch}: wall {wall:.2f}s")
        for k, (ms, n) in sorted(rows.items(), key=lambda kv: -kv[1][0]):
            print(f"  {k:<22} {ms:8.3f} ms x {n}")
    (args.out / "profile_step.json").write_text(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
