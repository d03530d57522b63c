"""What a JSON schema costs end to end, through the offline ``LLM`` (issue 15, item 5).

    python3 benchmarks/structured_e2e_gpu.py --model DIR [--num-seqs 256] [--out FILE.json]

``structured_masks.py`` times the masking phases beside a stand-in forward kernel; this
script times the real engine. ``--num-seqs`` requests (one batch: ``max_num_seqs`` is
set to it) decode under one JSON schema at temperature 1.0 (``load_format=dummy``: the
model's choices are random, the grammar keeps them valid). Then the same prompts run
without the schema, each with ``max_tokens`` set to the length its constrained twin
reached and ``ignore_eos``, so both runs schedule exactly the same prefill and decode
work and differ only by the constraint. Reported per run (median of ``--runs``): wall
time, and the pure decode steps' median time from the step timeline of
``w4_profile_gpu.py``; the ratio of the medians is what the schema adds to a step.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time
from pathlib import Path
from typing import Any

import torch
from engine import LLM, SamplingParams
from engine.sampling_params import StructuredOutputsParams
from kernel_profile import profile_generate
from structured_masks import SCHEMA
from w4_profile_gpu import StepTimeline


def _sync() -> None:
    if torch.cuda.is_available():
        torch.cuda.synchronize()


def _run(llm: Any, timeline: StepTimeline, prompts: list[Any], params: list[Any]) -> dict[str, Any]:
    _sync()
    timeline.reset()
    start = time.perf_counter()
    outs = llm.generate(prompts, params, use_tqdm=False)
    _sync()
    wall = time.perf_counter() - start
    decode = [1000 * r[0] for r in timeline.rows if not r[3]]
    full = [1000 * r[0] for r in timeline.rows if not r[3] and r[1] > 0.9 * len(prompts)]
    return {
        "wall_s": wall,
        "steps": len(timeline.rows),
        "decode_steps": len(decode),
        "decode_step_ms_p50": statistics.median(decode) if decode else None,
        "full_batch_decode_step_ms_p50": statistics.median(full) if full else None,
        "lengths": [len(o.outputs[0].token_ids) for o in outs],
        "texts": [o.outputs[0].text for o in outs[:3]],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", required=True)
    parser.add_argument("--num-seqs", type=int, default=256)
    parser.add_argument("--prompt-len", type=int, default=128)
    parser.add_argument("--max-tokens", type=int, default=256)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--out", type=Path)
    parser.add_argument("--dtype", default="bfloat16")
    parser.add_argument("--profile", action="store_true", help="kernel table of one run each")
    parser.add_argument(
        "--ab-masked-row-sampler",
        action="store_true",
        help="also the schema run with ENGINE_MASKED_ROW_SAMPLER=0 (the sampler's pipeline)",
    )
    args = parser.parse_args()
    timeline = StepTimeline()
    llm = LLM(
        args.model,
        load_format="dummy",
        dtype=args.dtype,
        max_model_len=args.prompt_len + args.max_tokens + 16,
        max_num_seqs=args.num_seqs,
        enable_prefix_caching=False,
    )
    gen = torch.Generator().manual_seed(0)
    vocab = 1000  # ordinary token ids, the same for every tokenizer
    prompts = [
        {"prompt_token_ids": torch.randint(100, vocab, (args.prompt_len,), generator=gen).tolist()}
        for _ in range(args.num_seqs)
    ]
    schema = StructuredOutputsParams(json=SCHEMA)
    constrained = [
        SamplingParams(temperature=1.0, max_tokens=args.max_tokens, structured_outputs=schema)
        for _ in range(args.num_seqs)
    ]
    llm.generate(prompts[:8], constrained[:8], use_tqdm=False)  # warm-up: compile, graphs
    runs: dict[str, list[dict[str, Any]]] = {"schema": [], "plain": []}
    if args.ab_masked_row_sampler:
        runs["schema_pipeline"] = []
    for _ in range(args.runs):
        if args.ab_masked_row_sampler:  # the sampler's pipeline instead of the one launch
            os.environ["ENGINE_MASKED_ROW_SAMPLER"] = "0"
            runs["schema_pipeline"].append(_run(llm, timeline, prompts, constrained))
            del os.environ["ENGINE_MASKED_ROW_SAMPLER"]
        runs["schema"].append(_run(llm, timeline, prompts, constrained))
        lengths = runs["schema"][-1]["lengths"]
        plain = [
            SamplingParams(temperature=1.0, max_tokens=max(n, 1), ignore_eos=True) for n in lengths
        ]
        runs["plain"].append(_run(llm, timeline, prompts, plain))
    report: dict[str, Any] = {"model": args.model, "num_seqs": args.num_seqs, "json_schema": SCHEMA}
    for name, rs in runs.items():
        report[name] = {
            key: statistics.median(r[key] for r in rs if r[key] is not None)
            for key in ("wall_s", "decode_step_ms_p50", "full_batch_decode_step_ms_p50")
            if any(r[key] is not None for r in rs)
        }
        report[name]["runs"] = [{k: v for k, v in r.items() if k != "lengths"} for r in rs]
    lengths = runs["schema"][-1]["lengths"]
    report["output_tokens"] = {"mean": statistics.mean(lengths), "max": max(lengths)}
    for key in ("wall_s", "decode_step_ms_p50", "full_batch_decode_step_ms_p50"):
        for name in ("schema", "schema_pipeline"):
            if key in report.get(name, {}) and key in report["plain"]:
                suffix = "" if name == "schema" else "_pipeline"
                report[f"added{suffix}_{key}"] = report[name][key] / report["plain"][key] - 1
    if args.profile:  # device time by kernel, one run of each (where the added time goes)
        report["profile"] = {
            "schema": profile_generate(llm, prompts, constrained),
            "plain": profile_generate(llm, prompts, plain),
        }
    print(json.dumps({k: v for k, v in report.items() if k != "json_schema"}, indent=1))
    if args.out:
        args.out.write_text(json.dumps(report, indent=1))


if __name__ == "__main__":
    main()
