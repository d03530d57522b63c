"""GPU check of programmatic dependent launch (``engine_sdk.layers.pdl``): greedy tokens are
identical with it on and off (``ENGINE_PDL=1`` / ``0``, each in its own process, as the
switch is read at import), for bf16, online FP8, AWQ and the fp8 KV cache, at batch 1 (the
W2 path: one-token GEMVs in the CUDA graph) and at batch 16 (several graph sizes), and
PDL changes no arithmetic, so any difference is a race. Prints one line per model and
exits 1 on a miss::

    python3 benchmarks/pdl_gpu.py --model .gpu/qwen3 --out $OUT/pdl_check.json

``--model``: a Qwen3-0.6B-shaped folder (config and tokenizer, dummy weights: the loader
seeds them, so both processes run the same model).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

PROMPTS = [f"prompt {i}: " + "word " * (5 * i + 3) for i in range(16)]
MODELS = {  # label -> LLM keywords (beside the folder); "awq" takes the AutoAWQ copy
    "bf16": {},
    "fp8": {"quantization": "fp8"},
    "awq": {},
    "bf16_fp8kv": {"kv_cache_dtype": "fp8"},
}


def child(model: Path, labels: list[str], dump: Path) -> None:
    import gc

    import torch
    from engine import LLM, SamplingParams

    params = SamplingParams(temperature=0.0, max_tokens=48, ignore_eos=True)
    result: dict[str, Any] = {"pdl": os.environ.get("ENGINE_PDL", "1")}
    for label in labels:
        folder = model.with_name(model.name + "-awq") if label == "awq" else model
        llm = LLM(
            str(folder), load_format="dummy", dtype="bfloat16",
            kv_cache_memory_bytes=2 << 30, max_model_len=4096, **MODELS[label],
        )  # fmt: skip
        start = time.perf_counter()
        one = llm.generate(PROMPTS[:1], params, use_tqdm=False)  # batch 1
        many = llm.generate(PROMPTS, params, use_tqdm=False)  # batch 16
        result[label] = {
            "batch1": [o.outputs[0].token_ids for o in one],
            "batch16": [o.outputs[0].token_ids for o in many],
            "seconds": round(time.perf_counter() - start, 2),
        }
        del llm
        gc.collect()
        torch.cuda.empty_cache()
    dump.write_text(json.dumps(result))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", type=Path, required=True)
    parser.add_argument("--models", default=",".join(MODELS))
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--child", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args()
    labels = args.models.split(",")
    if args.child:
        child(args.model, labels, args.child)
        return 0
    if "awq" in labels:
        sys.path.insert(0, str(Path(__file__).parent))
        from suite_extra import awq_variant

        awq_variant(args.model)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    runs = {}
    for flag in ("0", "1"):
        dump = args.out.with_name(f"{args.out.stem}_pdl{flag}.json")
        cmd = [sys.executable, __file__, "--model", str(args.model), "--models", args.models,
               "--out", str(args.out), "--child", str(dump)]  # fmt: skip
        proc = subprocess.run(cmd, env={**os.environ, "ENGINE_PDL": flag}, check=False)
        if proc.returncode or not dump.exists():
            print(f"ENGINE_PDL={flag}: the run failed ({proc.returncode})", flush=True)
            return 1
        runs[flag] = json.loads(dump.read_text())
    table: dict[str, Any] = {"date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())}
    misses = 0
    for label in labels:
        off, on = runs["0"][label], runs["1"][label]
        same = {part: off[part] == on[part] for part in ("batch1", "batch16")}
        misses += not all(same.values())
        table[label] = {**same, "seconds_off": off["seconds"], "seconds_on": on["seconds"]}
        print(f"{label:12s} PDL on == off: batch 1 {same['batch1']}, batch 16 {same['batch16']}"
              f"  ({off['seconds']} s off, {on['seconds']} s on)", flush=True)  # fmt: skip
    args.out.write_text(json.dumps(table, indent=1))
    return 1 if misses else 0


if __name__ == "__main__":
    sys.exit(main())
