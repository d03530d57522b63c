"""Tensor parallelism on one host: TP=1 against TP=2 on a Qwen3-0.6B-shaped model.

Run on a machine with two GPUs from the repository root (the engine installed or on
PYTHONPATH)::

    python benchmarks/tp_gpu.py --out results/tp_gpu.json [--model-dir DIR] [--quick]

The model is random (no download): a Qwen3-0.6B config (16 heads, 8 KV heads, 28 layers,
vocab 151936) written once as a real safetensors checkpoint, so both runs load the same
weights (``--load-format dummy`` would draw different random shards per rank). Every
configuration runs in its own process, so each one gets whole, empty GPUs. Measured:

- greedy parity in float32: the same prompts' greedy tokens under TP=1 and TP=2 (reported
  per prompt as the length of the common prefix; equal everywhere is the expectation);
- decode latency in bfloat16: one request, time per output token from step timestamps;
- throughput in bfloat16: a batch of requests, output and total tokens per second.

The JSON holds the command, GPUs, torch version and every number; a table is printed.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import random
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

QWEN3_0_6B = {
    "vocab_size": 151936,
    "hidden_size": 1024,
    "intermediate_size": 3072,
    "num_hidden_layers": 28,
    "num_attention_heads": 16,
    "num_key_value_heads": 8,
    "head_dim": 128,
    "max_position_embeddings": 40960,
    "rope_theta": 1000000.0,
    "tie_word_embeddings": True,
    "initializer_range": 0.02,
}


def build_model(path: Path) -> Path:
    if (path / "config.json").is_file():
        return path
    from engine_sdk.testing.models import build_tiny_model

    print(f"writing a random Qwen3-0.6B-shaped checkpoint to {path} ...", flush=True)
    return build_tiny_model(path, "Qwen3ForCausalLM", **QWEN3_0_6B)


def _prompts(llm: Any, num: int, length: int, seed: int) -> list[list[int]]:
    """Random token ids (the model is random too, so text would mean nothing)."""
    rng = random.Random(seed)
    top = min(int(llm.engine.vocab_size), 150000)
    return [[rng.randrange(10, top) for _ in range(length)] for _ in range(num)]


# -- one configuration (child process) ----------------------------------------------------


def _decode_latency(llm: Any, prompt_len: int, num_tokens: int) -> dict[str, float]:
    from engine import SamplingParams

    engine = llm.engine
    params = SamplingParams(temperature=0.0, max_tokens=num_tokens, ignore_eos=True)
    engine.add_request("latency", _prompts(llm, 1, prompt_len, 7)[0], params)
    stamps = [time.perf_counter()]
    while engine.has_unfinished_requests():
        engine.step()
        stamps.append(time.perf_counter())
    steps = [b - a for a, b in zip(stamps[1:], stamps[2:], strict=False)]
    steps.sort()
    return {
        "ttft_ms": (stamps[1] - stamps[0]) * 1e3,
        "tpot_ms_mean": sum(steps) / len(steps) * 1e3,
        "tpot_ms_p50": steps[len(steps) // 2] * 1e3,
        "num_output_tokens": num_tokens,
    }


def _throughput(llm: Any, num: int, prompt_len: int, out_len: int) -> dict[str, float]:
    from engine import SamplingParams

    params = SamplingParams(temperature=0.0, max_tokens=out_len, ignore_eos=True)
    prompts = _prompts(llm, num, prompt_len, 11)
    start = time.perf_counter()
    outs = llm.generate([{"prompt_token_ids": p} for p in prompts], params, use_tqdm=False)
    elapsed = time.perf_counter() - start
    num_out = sum(len(o.outputs[0].token_ids) for o in outs)
    return {
        "num_requests": num,
        "elapsed_s": elapsed,
        "output_tokens_per_s": num_out / elapsed,
        "total_tokens_per_s": (num_out + num * prompt_len) / elapsed,
    }


def child(args: argparse.Namespace) -> None:
    from engine import LLM, SamplingParams

    common: dict[str, Any] = {"max_model_len": args.max_model_len, "gpu_memory_utilization": 0.85}
    if args.enforce_eager:
        common["enforce_eager"] = True
    result: dict[str, Any] = {"tp": args.tp, "mode": args.mode}
    start = time.perf_counter()
    dtype = "float32" if args.mode == "parity" else "bfloat16"
    llm = LLM(model=str(args.model_dir), tensor_parallel_size=args.tp, dtype=dtype, **common)
    result["startup_s"] = time.perf_counter() - start
    if args.mode == "parity":
        params = SamplingParams(temperature=0.0, max_tokens=args.parity_tokens, ignore_eos=True)
        prompts = [{"prompt_token_ids": p} for p in _prompts(llm, 8, 64, 3)]
        outs = llm.generate(prompts, params, use_tqdm=False)
        result["greedy"] = [o.outputs[0].token_ids for o in outs]
    else:
        _throughput(llm, 4, 32, 8)  # warm up
        result["decode"] = _decode_latency(llm, 128, args.decode_tokens)
        result["throughput"] = _throughput(llm, args.batch, 128, 128)
    Path(args.child_out).write_text(json.dumps(result))


# -- driver -------------------------------------------------------------------------------


def run_child(args: argparse.Namespace, tp: int, mode: str, out: Path) -> dict[str, Any]:
    child_out = out.with_suffix(f".tp{tp}.{mode}.json")
    cmd = [sys.executable, __file__, "--child", "--tp", str(tp), "--mode", mode]
    cmd += ["--model-dir", str(args.model_dir), "--child-out", str(child_out)]
    cmd += ["--batch", str(args.batch), "--decode-tokens", str(args.decode_tokens)]
    cmd += ["--parity-tokens", str(args.parity_tokens), "--max-model-len", str(args.max_model_len)]
    if args.enforce_eager:
        cmd.append("--enforce-eager")
    print("$", " ".join(cmd), flush=True)
    env = {**os.environ, "NCCL_NVLS_ENABLE": "0"}
    done = subprocess.run(cmd, env=env, timeout=1800)
    if done.returncode != 0:
        return {"tp": tp, "mode": mode, "error": f"exit code {done.returncode}"}
    result: dict[str, Any] = json.loads(child_out.read_text())
    return result


def _common_prefix(a: list[int], b: list[int]) -> int:
    n = 0
    while n < min(len(a), len(b)) and a[n] == b[n]:
        n += 1
    return n


def _environment() -> dict[str, Any]:
    import torch

    gpus = [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())]
    try:
        commit = subprocess.run(
            ["git", "rev-parse", "HEAD"], capture_output=True, text=True, check=False
        ).stdout.strip()
    except OSError:
        commit = ""
    return {
        "command": " ".join([sys.executable, *sys.argv]),
        "gpus": gpus,
        "torch": torch.__version__,
        "python": platform.python_version(),
        "git_commit": commit,
        "date": time.strftime("%Y-%m-%d %H:%M:%S"),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path("results/tp_gpu.json"))
    parser.add_argument("--model-dir", type=Path, default=Path("/tmp/qwen3-0.6b-random"))
    parser.add_argument("--batch", type=int, default=256)
    parser.add_argument("--decode-tokens", type=int, default=256)
    parser.add_argument("--parity-tokens", type=int, default=64)
    parser.add_argument("--max-model-len", type=int, default=4096)
    parser.add_argument("--enforce-eager", action="store_true")
    parser.add_argument("--quick", action="store_true", help="small batch and few tokens")
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--tp", type=int, default=1, help=argparse.SUPPRESS)
    parser.add_argument("--mode", default="perf", help=argparse.SUPPRESS)
    parser.add_argument("--child-out", default="", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        child(args)
        return
    if args.quick:
        args.batch, args.decode_tokens, args.parity_tokens = 32, 64, 32
    args.out.parent.mkdir(parents=True, exist_ok=True)
    build_model(args.model_dir)
    report: dict[str, Any] = {"environment": _environment(), "model": QWEN3_0_6B, "runs": []}
    runs = {
        (tp, mode): run_child(args, tp, mode, args.out)
        for mode in ("parity", "perf")
        for tp in (1, 2)
    }
    report["runs"] = list(runs.values())
    g1, g2 = runs[(1, "parity")].get("greedy"), runs[(2, "parity")].get("greedy")
    if g1 is not None and g2 is not None:
        prefixes = [_common_prefix(a, b) for a, b in zip(g1, g2, strict=True)]
        report["parity"] = {
            "dtype": "float32",
            "num_prompts": len(prefixes),
            "num_tokens": args.parity_tokens,
            "common_prefix_per_prompt": prefixes,
            "all_equal": all(a == b for a, b in zip(g1, g2, strict=True)),
        }
    args.out.write_text(json.dumps(report, indent=2))
    print(f"\nwrote {args.out}")
    print(f"{'TP':>3} {'startup s':>10} {'TTFT ms':>8} {'TPOT ms':>8} {'out tok/s':>10}")
    for tp in (1, 2):
        r = runs[(tp, "perf")]
        if "error" in r:
            print(f"{tp:>3} failed: {r['error']}")
            continue
        d, t = r["decode"], r["throughput"]
        print(
            f"{tp:>3} {r['startup_s']:>10.1f} {d['ttft_ms']:>8.2f} {d['tpot_ms_p50']:>8.3f} "
            f"{t['output_tokens_per_s']:>10.0f}"
        )
    print("greedy parity (float32):", report.get("parity", "not measured"))


if __name__ == "__main__":
    main()
