"""GPU check of async scheduling: greedy tokens identical with it on and off, and equal to
the torch reference attention backend (float32), on a tiny random Qwen3 model; seeded
sampling with penalties identical on and off. Prints one line per check, exits 1 on a miss.

    python3 benchmarks/async_check_gpu.py
"""

from __future__ import annotations

import sys
import tempfile
from pathlib import Path

from engine import LLM, SamplingParams
from engine_sdk.testing.models import build_tiny_model

PROMPTS = [f"prompt {i}: " + "word " * (3 * i + 1) for i in range(24)]


def main() -> int:
    path = build_tiny_model(Path(tempfile.mkdtemp()), "Qwen3ForCausalLM")
    base = {"device": "cuda", "dtype": "float32", "kv_cache_memory_bytes": 1 << 30}
    runs = {
        "triton_async": LLM(str(path), **base),
        "triton_sync": LLM(str(path), async_scheduling=False, **base),
        "reference_async": LLM(str(path), attention_backend="reference", **base),
    }
    failures = 0
    cases = {
        "greedy": SamplingParams(temperature=0.0, max_tokens=40, ignore_eos=True),
        "seeded+penalties": SamplingParams(
            temperature=0.8, seed=3, repetition_penalty=1.2, max_tokens=24, ignore_eos=True
        ),
        "logprobs": SamplingParams(temperature=0.0, max_tokens=8, logprobs=2, ignore_eos=True),
    }
    for name, params in cases.items():
        outs = {k: llm.generate(PROMPTS, params, use_tqdm=False) for k, llm in runs.items()}
        ids = {k: [o.outputs[0].token_ids for o in v] for k, v in outs.items()}
        same = ids["triton_async"] == ids["triton_sync"]
        ref = ids["triton_async"] == ids["reference_async"]
        print(f"{name:18s} async==sync {same}  triton==reference {ref}", flush=True)
        failures += (not same) + (name == "greedy" and not ref)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
