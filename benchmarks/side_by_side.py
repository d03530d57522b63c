"""Engine and vLLM on the same GPU in the same run: W1, W2, W4 and the Llama-8B shape.

Figures on the GPU machine move 10-25% between runs, so a ratio to vLLM only counts when
both ran in one call. Run on the GPU machine from the repository root, after the vLLM
anchor is unpacked (``../shared/vllm-anchor``: ``$HOME/v/env.sh`` and ``$VLLM_MODEL``):

    python3 benchmarks/side_by_side.py --parts w1,w4 --out $OUT/sbs.json
    python3 benchmarks/side_by_side.py --parts llama8b_fp8,llama8b_awq --out $OUT/sbs_q.json
    python3 benchmarks/side_by_side.py --parts w1_kvfp8,w1_fp8,llama8bw1,llama8bw1_fp8 --out F

Parts: ``w1`` and ``w4`` (offline throughput; ``w4same``: W4 with vLLM's random draw fed
to both engines, ``vllm_requests.py``), ``prefill`` (W1's prompts, one output
token), ``w2`` and ``llama8b`` (batch-1 latency); W1 on the 8B shape is ``llama8bw1``.
Suffixes: ``_fp8`` (both engines quantize online), ``_awq`` (both load an AutoAWQ-config
copy; batch-1 and W1 parts) and, for the W1 parts, ``_kvfp8`` (an fp8 KV cache in both).

Engine runs through its CLI (``engine bench``, async scheduling on, and off where a part
lists ``sync``); vLLM runs its own ``vllm bench`` in a subshell with its environment, so
its packages stay off Engine's path. Both load the same model folder with dummy weights.
Each part records both figures, their ratio and the commands.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from suite_extra import awq_variant

HOME = Path(os.environ.get("HOME", "/root"))
LLAMA_8B = {
    "architectures": ["LlamaForCausalLM"],
    "model_type": "llama",
    "vocab_size": 128256,
    "hidden_size": 4096,
    "intermediate_size": 14336,
    "num_hidden_layers": 32,
    "num_attention_heads": 32,
    "num_key_value_heads": 8,
    "max_position_embeddings": 131072,
    "rms_norm_eps": 1e-5,
    "rope_theta": 500000.0,
    "tie_word_embeddings": False,
    "torch_dtype": "bfloat16",
    "hidden_act": "silu",
    "bos_token_id": 128000,
    "eos_token_id": 128001,
}
# Prefill ceiling for the Qwen3-0.6B shape: 2 FLOPs per weight per token over the 0.44 B
# non-embedding weights (28 layers x (q/k/v/o 6.3 M + MLP 9.4 M)) plus attention over an
# average 256-token context (4 x 28 x 256 x 2048), at the measured 743 TFLOP/s bf16 rate.
_FLOPS_PER_TOKEN = 2 * 28 * (1024 * (2048 + 2 * 1024) + 2048 * 1024 + 3 * 1024 * 3072)
_FLOPS_PER_TOKEN += 4 * 28 * 256 * 2048
ROOFLINE_TOK_S = 743e12 / _FLOPS_PER_TOKEN
# name -> (engine bench args, vllm bench args, what is compared)
W1 = ("throughput", ["--num-prompts", "1024", "--input-len", "512", "--output-len", "256"])
W4_ENGINE = ["--dataset-name", "nano-vllm", "--max-model-len", "4096", "--temperature", "0.6"]
W4_VLLM = [
    "--dataset-name", "random", "--random-input-len", "562", "--random-output-len", "562",
    "--random-range-ratio", "0.822", "--num-prompts", "256", "--max-model-len", "4096",
]  # fmt: skip
W2 = ["--batch-size", "1", "--input-len", "128", "--output-len", "256"]


def sh(cmd: str, log: Path, timeout: int) -> tuple[int, str]:
    print("$", cmd, flush=True)
    start = time.perf_counter()
    try:
        proc = subprocess.run(
            ["bash", "-c", cmd], capture_output=True, text=True, timeout=timeout, check=False
        )
        text, code = proc.stdout + proc.stderr, proc.returncode
    except subprocess.TimeoutExpired as exc:
        text, code = f"{exc.stdout or ''}{exc.stderr or ''}\nTIMEOUT", 124
    log.write_text(text)
    print(f"  exit {code} in {time.perf_counter() - start:.0f} s", flush=True)
    if code:
        print("\n".join(text.splitlines()[-15:]), flush=True)
    return code, text


def engine(out: Path, name: str, kind: str, model: Path, args: list[str], sync: bool) -> Any:
    result = out / f"{name}.json"
    flags = " --no-async-scheduling" if sync else ""
    cmd = (
        f"{sys.executable} -m engine.cli.main bench {kind} --model {model} --load-format dummy "
        f"--dtype bfloat16 {' '.join(args)}{flags} --save-result {result}"
    )
    code, _ = sh(cmd, out / f"{name}.log", 600)
    if code or not result.exists():
        return None
    data = json.loads(result.read_text())
    data["command"] = cmd
    return data


def vllm(out: Path, name: str, kind: str, model: Path, args: list[str]) -> dict[str, Any] | None:
    cmd = (
        f"(source {HOME}/v/env.sh; vllm bench {kind} --model {model} --load-format dummy "
        f"--dtype bfloat16 {' '.join(args)})"
    )
    code, text = sh(cmd, out / f"{name}.log", 600)
    if code:
        return None
    found: dict[str, Any] = {"command": cmd}
    m = re.search(r"([\d.]+) output tokens/s", text)
    if m:
        found["output_tokens_per_s"] = float(m.group(1))
    m = re.search(r"([\d.]+) total tokens/s", text)
    if m:
        found["total_tokens_per_s"] = float(m.group(1))
    m = re.search(r"Avg latency: ([\d.]+) seconds", text)
    if m:
        found["avg_latency_s"] = float(m.group(1))
    return found


def _no_vllm(*_: Any) -> dict[str, Any] | None:
    return None


def llama_dir(out: Path, tokenizer_dir: Path) -> Path:
    path = out / "llama-8b"
    path.mkdir(parents=True, exist_ok=True)
    for f in tokenizer_dir.iterdir():
        if f.name != "config.json" and f.is_file():
            shutil.copy(f, path / f.name)
    (path / "config.json").write_text(json.dumps(LLAMA_8B))
    return path


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--parts", default="w1,w4")
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--sync", action="store_true", help="also Engine --no-async-scheduling")
    parser.add_argument("--engine-only", action="store_true", help="skip vLLM (no ratio)")
    parser.add_argument("--model", type=Path, help="Qwen3-0.6B-shaped folder (default $VLLM_MODEL)")
    args = parser.parse_args()
    work = Path("/tmp/sbs")
    work.mkdir(exist_ok=True)
    qwen = args.model or Path(os.environ.get("VLLM_MODEL", str(HOME / "v/model")))
    run_vllm = _no_vllm if args.engine_only else vllm

    table: dict[str, Any] = {"date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())}
    commit = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True)
    table["commit"] = commit.stdout.strip() or os.environ.get("ENGINE_COMMIT", "")

    def keep(part: str, row: dict[str, Any]) -> None:
        """Write the table now: a call cut by its time limit keeps the rows so far."""
        table[part] = row
        args.out.write_text(json.dumps(table, indent=1))

    for part in args.parts.split(","):
        row: dict[str, Any] = {"metric": "output_tokens_per_s"}
        if part.partition("_")[0] in ("w1", "llama8bw1"):
            # W1 on the 0.6B shape (w1) or the 8B one (llama8bw1); with _fp8 both engines
            # quantize online, with _awq both load the AutoAWQ-config copy, with _kvfp8
            # both keep an fp8 KV cache (issue 23's W1 rows)
            shape, _, variant = part.partition("_")
            model = qwen if shape == "w1" else llama_dir(work, qwen)
            extra = {"": [], "fp8": ["--quantization", "fp8"], "awq": [],
                     "kvfp8": ["--kv-cache-dtype", "fp8"]}.get(variant)  # fmt: skip
            if extra is None:
                raise SystemExit(f"unknown part {part!r}")
            if variant == "awq":
                model = awq_variant(model)
            row["engine"] = engine(work, part, "throughput", model, W1[1] + extra, False)
            keep(part, row)
            if args.sync:
                row["engine_sync"] = engine(
                    work, part + "_sync", "throughput", model, W1[1] + extra, True
                )
            vargs = ["--dataset-name", "random", "--random-input-len", "512"]
            vargs += ["--random-output-len", "256", "--num-prompts", "1024", *extra]
            row["vllm"] = run_vllm(work, part + "_vllm", "throughput", model, vargs)
            key = "output_tokens_per_s"
        elif part == "w4":
            row["engine"] = engine(work, "w4", "throughput", qwen, W4_ENGINE, False)
            keep(part, row)
            if args.sync:
                row["engine_sync"] = engine(work, "w4_sync", "throughput", qwen, W4_ENGINE, True)
            row["vllm"] = run_vllm(work, "w4_vllm", "throughput", qwen, W4_VLLM)
            key = "output_tokens_per_s"
        elif part == "w4same":
            # W4 with one request list: vLLM's random draw (W4_VLLM, seed 0), written in
            # vLLM's environment by vllm_requests.py and read by Engine's custom dataset
            data = work / "w4_requests.jsonl"
            dump = Path(__file__).resolve().parent / "vllm_requests.py"
            vlen = W4_VLLM[W4_VLLM.index("--random-input-len") :]
            code, text = sh(
                f"(source {HOME}/v/env.sh; python3 {dump} --model {qwen} --out {data} "
                f"{' '.join(a for a in vlen if a != '--max-model-len' and a != '4096')})",
                work / "w4same_requests.log",
                300,
            )
            row["requests"] = text.strip().splitlines()[-1:] if not code else None
            if not code:
                eargs = ["--dataset-name", "custom", "--dataset-path", str(data)]
                eargs += ["--max-model-len", "4096"]
                row["engine"] = engine(work, "w4same", "throughput", qwen, eargs, False)
                keep(part, row)
                row["vllm"] = run_vllm(work, "w4same_vllm", "throughput", qwen, W4_VLLM)
            key = "output_tokens_per_s"
        elif part == "prefill":  # W1's prompts with one output token: prefill rate
            pargs = ["--num-prompts", "1024", "--input-len", "512", "--output-len", "1"]
            row["engine"] = engine(work, "prefill", "throughput", qwen, pargs, False)
            keep(part, {**row, "metric": "prefill_tokens_per_s"})
            vargs = ["--dataset-name", "random", "--random-input-len", "512"]
            vargs += ["--random-output-len", "1", "--num-prompts", "1024"]
            v = run_vllm(work, "prefill_vllm", "throughput", qwen, vargs)
            for r in (row["engine"], v):
                if r and "elapsed_s" in r:
                    r["prefill_tokens_per_s"] = r["prompt_tokens"] / r["elapsed_s"]
                    r["fraction_of_bf16_roofline"] = r["prefill_tokens_per_s"] / ROOFLINE_TOK_S
            if v and "total_tokens_per_s" in v:  # vLLM prints total = prompt + 1 per request
                v["prefill_tokens_per_s"] = v["total_tokens_per_s"] * 512 / 513
                v["fraction_of_bf16_roofline"] = v["prefill_tokens_per_s"] / ROOFLINE_TOK_S
            row["vllm"] = v
            key = "prefill_tokens_per_s"
        elif part.partition("_")[0] in ("w2", "llama8b"):
            # w2 / llama8b, bf16; with _fp8 both engines quantize online (--quantization
            # fp8), with _awq both load a copy whose config declares AutoAWQ 4-bit
            shape, _, quant = part.partition("_")
            model = qwen if shape == "w2" else llama_dir(work, qwen)
            if quant not in ("", "fp8", "awq"):
                raise SystemExit(f"unknown part {part!r}")
            if quant == "awq":
                model = awq_variant(model)
            iters = ["--num-iters", "3", "--num-iters-warmup", "1"]
            iters += ["--quantization", "fp8"] if quant == "fp8" else []
            row["engine"] = engine(work, part, "latency", model, W2 + iters, False)
            keep(part, {**row, "metric": "ms_per_output_token"})
            if args.sync:
                row["engine_sync"] = engine(
                    work, part + "_sync", "latency", model, W2 + iters, True
                )
            v = run_vllm(work, part + "_vllm", "latency", model, W2 + iters)
            if v and "avg_latency_s" in v:
                v["ms_per_output_token"] = 1000 * v["avg_latency_s"] / 256
            row["vllm"] = v
            key = "ms_per_output_token"
        else:
            raise SystemExit(f"unknown part {part!r}")
        e, v = row.get("engine") or {}, row.get("vllm") or {}
        if key in e and key in v:
            row["engine_over_vllm"] = (
                e[key] / v[key] if key.endswith("per_s") else v[key] / e[key]
            )  # > 1: Engine faster
        row["metric"] = key
        keep(part, row)
    print("\npart        metric                 engine      engine_sync  vllm        engine/vllm")
    for part in args.parts.split(","):
        row = table[part]
        key = row["metric"]
        cells = [
            f"{(row.get(k) or {}).get(key, float('nan')):.3f}"
            for k in ("engine", "engine_sync", "vllm")
        ]
        ratio = row.get("engine_over_vllm", float("nan"))
        print(f"{part:11s} {key:22s} {cells[0]:11s} {cells[1]:12s} {cells[2]:11s} {ratio:.2f}x")


if __name__ == "__main__":
    main()
