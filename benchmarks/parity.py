"""Triton backend versus the torch reference backend on a real-shaped random model (GPU).

float32: greedy tokens must be identical. bfloat16: prompt logprobs within tolerance and
the share of identical greedy continuations reported. Writes parity.json under --out.
"""

from __future__ import annotations

import argparse
import gc
import json
import random
from pathlib import Path
from typing import Any

import torch
from engine import LLM, SamplingParams


def _run(model: str, backend: str, dtype: str, prompts: list[list[int]]) -> list[Any]:
    llm = LLM(
        model=model,
        load_format="dummy",
        dtype=dtype,
        attention_backend=backend,
        gpu_memory_utilization=0.4,
        max_model_len=2048,
        seed=0,
        enforce_eager=True,
    )
    params = SamplingParams(temperature=0.0, max_tokens=24, prompt_logprobs=0, ignore_eos=True)
    outs = llm.generate([{"prompt_token_ids": p} for p in prompts], params, use_tqdm=False)
    del llm
    gc.collect()
    torch.cuda.empty_cache()
    return outs


def _prompt_lps(out: Any) -> list[float]:
    return [lp.logprob for lp in (out.prompt_logprobs or []) if lp is not None]


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--model", required=True)
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    rng = random.Random(0)
    lens = [1, 7, 16, 33, 100, 257, 513, 1000]
    prompts = [[rng.randrange(10000) for _ in range(n)] for n in lens]
    result: dict[str, Any] = {}
    for dtype in ("float32", "bfloat16"):
        ref = _run(args.model, "reference", dtype, prompts)
        tri = _run(args.model, "triton", dtype, prompts)
        same = sum(
            r.outputs[0].token_ids == t.outputs[0].token_ids for r, t in zip(ref, tri, strict=False)
        )
        diffs = [
            abs(a - b)
            for r, t in zip(ref, tri, strict=False)
            for a, b in zip(_prompt_lps(r), _prompt_lps(t), strict=False)
        ]
        result[dtype] = {
            "greedy_identical": f"{same}/{len(prompts)}",
            "max_prompt_logprob_diff": max(diffs) if diffs else None,
        }
    result["greedy_match"] = result["float32"]["greedy_identical"]
    result["max_logprob_diff"] = result["bfloat16"]["max_prompt_logprob_diff"]
    print(json.dumps(result, indent=2))
    (args.out / "parity.json").write_text(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
