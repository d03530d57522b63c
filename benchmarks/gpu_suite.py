"""The whole GPU benchmark suite in one run: correctness first, then W1-W4, then a table.

Run on the GPU machine from the repository root (the engine installed or on PYTHONPATH):

    python benchmarks/gpu_suite.py --out results/ --tokenizer-dir PATH [--parts ...]

Every workload runs through the real CLI (``engine bench ...``) in its own process, so each
gets the whole GPU, and writes its JSON (command, git commit, GPU, date) under ``--out``.
The printed table compares each figure with its roofline and with Hugging Face generate.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from suite_extra import GilProfile, part_masks, part_quant

QWEN3_0_6B = {
    "architectures": ["Qwen3ForCausalLM"],
    "model_type": "qwen3",
    "vocab_size": 151936,
    "hidden_size": 1024,
    "intermediate_size": 3072,
    "num_hidden_layers": 28,
    "num_attention_heads": 16,
    "num_key_value_heads": 8,
    "head_dim": 128,
    "max_position_embeddings": 40960,
    "rms_norm_eps": 1e-6,
    "rope_theta": 1000000,
    "tie_word_embeddings": True,
    "torch_dtype": "bfloat16",
    "hidden_act": "silu",
    "attention_bias": False,
    "bos_token_id": 151643,
    "eos_token_id": 151645,
}
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
    "rope_scaling": {
        "rope_type": "llama3",
        "factor": 8.0,
        "low_freq_factor": 1.0,
        "high_freq_factor": 4.0,
        "original_max_position_embeddings": 8192,
    },
    "tie_word_embeddings": False,
    "torch_dtype": "bfloat16",
    "hidden_act": "silu",
    "bos_token_id": 128000,
    "eos_token_id": 128001,
}

# Measured references from the issue (same H200 model): used for ratios in the table.
ROOFLINE = {"w1_tok_s": 47000.0, "w2_ms_per_tok": 0.29}
VLLM = {"w1_tok_s": 20700.0, "w2_ms_per_tok": 1.9, "w4_tok_s": 24000.0}


def make_model_dir(root: Path, name: str, config: dict[str, Any], tokenizer_dir: Path) -> Path:
    path = root / name
    path.mkdir(parents=True, exist_ok=True)
    (path / "config.json").write_text(json.dumps(config, indent=2))
    for f in tokenizer_dir.iterdir():
        if f.is_file():
            shutil.copy(f, path / f.name)
    return path


def run(cmd: list[str], log: Path, timeout: int) -> tuple[int, float]:
    print("$", " ".join(cmd), flush=True)
    start = time.perf_counter()
    with log.open("w") as fh:
        proc = subprocess.run(cmd, stdout=fh, stderr=subprocess.STDOUT, timeout=timeout)
    elapsed = time.perf_counter() - start
    tail = log.read_text().splitlines()[-25:]
    print("\n".join(tail), flush=True)
    return proc.returncode, elapsed


def bench(out: Path, name: str, args: list[str], timeout: int = 900) -> dict[str, Any] | None:
    result = out / f"{name}.json"
    code, _ = run(
        [sys.executable, "-m", "engine.cli.main", "bench", *args, "--save-result", str(result)],
        out / f"{name}.log",
        timeout,
    )
    if code != 0 or not result.exists():
        print(f"!! {name} failed (exit {code}); see {name}.log", flush=True)
        return None
    return dict(json.loads(result.read_text()))


def part_correctness(out: Path, model: Path) -> dict[str, Any]:
    code, _ = run(
        [
            sys.executable,
            "-m",
            "pytest",
            "-q",
            "-p",
            "no:cacheprovider",
            "plugins/triton/tests",
            "tests/fused",
        ],
        out / "triton_tests.log",
        600,
    )
    parity_log = out / "parity.log"
    code2, _ = run(
        [sys.executable, "benchmarks/parity.py", "--model", str(model), "--out", str(out)],
        parity_log,
        600,
    )
    parity = out / "parity.json"
    data = json.loads(parity.read_text()) if parity.exists() else {}
    return {"triton_tests_pass": code == 0, "parity_exit": code2, **data}


def part_hf(out: Path, model: Path) -> dict[str, Any]:
    code, _ = run(
        [sys.executable, "benchmarks/hf_baseline.py", "--model", str(model), "--out", str(out)],
        out / "hf.log",
        900,
    )
    path = out / "hf.json"
    return json.loads(path.read_text()) if path.exists() else {"hf_exit": code}


def start_server(
    out: Path, model: Path, port: int, extra: tuple[str, ...] = (), log_name: str = "server.log"
) -> subprocess.Popen[bytes]:
    log = (out / log_name).open("w")
    cmd = [
        sys.executable,
        "-m",
        "engine.cli.main",
        "serve",
        str(model),
        "--load-format",
        "dummy",
        "--dtype",
        "bfloat16",
        "--port",
        str(port),
        *extra,
    ]
    proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT)
    import urllib.request

    deadline = time.time() + 600
    while time.time() < deadline:
        if proc.poll() is not None:
            raise RuntimeError("server exited; see server.log")
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2) as r:
                if r.status == 200:
                    return proc
        except OSError:
            time.sleep(2)
    proc.kill()
    raise RuntimeError("server did not become healthy in 600 s")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--tokenizer-dir", type=Path, required=True)
    parser.add_argument("--parts", default="correctness,hf,w1,w2,w3,w4,prefix,llama8b,masks,quant")
    parser.add_argument("--num-prompts", type=int, default=1024)
    parser.add_argument("--summary", type=Path, help="Also write suite.json here after each part")
    args = parser.parse_args()
    out: Path = args.out
    out.mkdir(parents=True, exist_ok=True)
    models = out / "models"
    qwen = make_model_dir(models, "qwen3-0.6b", QWEN3_0_6B, args.tokenizer_dir)
    llama = make_model_dir(models, "llama-3.1-8b", LLAMA_8B, args.tokenizer_dir)
    common = ["--load-format", "dummy", "--dtype", "bfloat16"]
    n = str(args.num_prompts)
    results: dict[str, Any] = _Checkpointed(args.summary)

    def run_correctness() -> None:
        results["correctness"] = part_correctness(out, qwen)

    def run_profile() -> None:
        run(
            [sys.executable, "benchmarks/profile_step.py", "--model", str(qwen), "--out", str(out)],
            out / "profile_step.log",
            600,
        )

    def run_hf() -> None:
        results["hf"] = part_hf(out, qwen)

    def run_w1() -> None:
        results["w1"] = bench(
            out,
            "w1",
            [
                "throughput",
                "--model",
                str(qwen),
                *common,
                "--num-prompts",
                n,
                "--input-len",
                "512",
                "--output-len",
                "256",
            ],
        )

    def run_w2() -> None:
        results["w2"] = bench(
            out,
            "w2",
            [
                "latency",
                "--model",
                str(qwen),
                *common,
                "--batch-size",
                "1",
                "--input-len",
                "128",
                "--output-len",
                "256",
                "--num-iters",
                "3",
                "--num-iters-warmup",
                "1",
            ],
        )

    def run_w4() -> None:
        results["w4"] = bench(
            out,
            "w4",
            [
                "throughput",
                "--model",
                str(qwen),
                *common,
                "--dataset-name",
                "nano-vllm",
                "--max-model-len",
                "4096",
                "--temperature",
                "0.6",
            ],
        )

    def run_prefix() -> None:
        results["prefix"] = bench(
            out,
            "prefix",
            [
                "throughput",
                "--model",
                str(qwen),
                *common,
                "--num-prompts",
                n,
                "--input-len",
                "112",
                "--output-len",
                "256",
                "--random-prefix-len",
                "400",
            ],
        )

    def serve_w3(modes: tuple[tuple[str, tuple[str, ...], tuple[int, ...]], ...]) -> None:
        for mode, extra, concs in modes:
            server = start_server(out, qwen, 8011, extra, f"server{mode}.log")
            try:
                for conc in concs:
                    # py-spy on the one front-end process (with several, the pid is the
                    # supervisor's, which only waits).
                    single = mode == "_api1"
                    profile = GilProfile(out, server.pid) if conc == 256 and single else None
                    results[f"w3{mode}_c{conc}"] = bench(
                        out,
                        f"w3{mode}_c{conc}",
                        [
                            "serve", "--base-url", "http://127.0.0.1:8011/v1", "--num-prompts", n,
                            "--input-len", "512", "--output-len", "256",
                            "--max-concurrency", str(conc), "--num-workers", "4",
                        ],
                    )  # fmt: skip
                    if profile is not None:
                        results["w3_gil"] = profile.summary()
            finally:
                server.send_signal(signal.SIGTERM)
                server.wait(60)

    def run_w3() -> None:
        # The default server (on a GPU: two API server processes over the engine process),
        # one API server process, and the engine in a thread of the server process
        # (--no-engine-process) at concurrency 256 for comparison.
        serve_w3(
            (
                ("", (), (256, 16)),
                ("_api1", ("--api-server-count", "1"), (256,)),
                ("_thread", ("--no-engine-process",), (256,)),
            )
        )

    def run_w3quick() -> None:  # the default server at concurrency 256 only
        serve_w3((("", (), (256,)),))

    def run_w3multi() -> None:  # one, two and four API server processes
        serve_w3(
            (
                ("_api1", ("--api-server-count", "1"), (256,)),
                ("_api2", ("--api-server-count", "2"), (256, 16)),
                ("_api4", ("--api-server-count", "4"), (256,)),
            )
        )

    def run_llama8b() -> None:
        results["llama8b_w2"] = bench(
            out,
            "llama8b_w2",
            [
                "latency",
                "--model",
                str(llama),
                *common,
                "--batch-size",
                "1",
                "--input-len",
                "128",
                "--output-len",
                "256",
                "--num-iters",
                "2",
                "--num-iters-warmup",
                "1",
            ],
        )
        results["llama8b_w1"] = bench(
            out,
            "llama8b_w1",
            [
                "throughput",
                "--model",
                str(llama),
                *common,
                "--num-prompts",
                n,
                "--input-len",
                "512",
                "--output-len",
                "256",
            ],
        )

    def run_masks() -> None:
        results["masks"] = part_masks(out, args.tokenizer_dir, run)

    def run_quant() -> None:
        results["quant"] = part_quant(out, qwen, llama, n, bench, run)

    steps = {name: fn for name, fn in locals().items() if name.startswith("run_")}
    for name in args.parts.split(","):  # in the order given: the most needed first
        step = steps.get(f"run_{name}")
        if step is None:
            if name != "none":
                print(f"!! unknown part {name!r}; known: {sorted(steps)}", flush=True)
            continue
        step()

    (out / "suite.json").write_text(json.dumps(results, indent=2, default=str))
    print_table(results)


class _Checkpointed(dict[str, Any]):
    """A results dict that rewrites the summary file whenever a part finishes."""

    def __init__(self, path: Path | None) -> None:
        super().__init__()
        self.path = path

    def __setitem__(self, key: str, value: Any) -> None:
        super().__setitem__(key, value)
        if self.path is not None:
            self.path.write_text(json.dumps(self, indent=2, default=str))


def _get(d: dict[str, Any] | None, *keys: str) -> Any:
    for k in keys:
        if not isinstance(d, dict) or k not in d:
            return None
        d = d[k]
    return d


def print_table(results: dict[str, Any]) -> None:
    hf = results.get("hf") or {}
    rows: list[tuple[str, Any, str]] = []
    w1 = _get(results.get("w1"), "output_tokens_per_s")
    if w1:
        rows.append(
            (
                "W1 offline output tok/s",
                w1,
                f"{w1 / ROOFLINE['w1_tok_s']:.0%} of roofline, "
                f"{w1 / VLLM['w1_tok_s']:.2f}x vLLM, "
                f"{w1 / hf['hf_batch_tok_s']:.1f}x HF"
                if hf.get("hf_batch_tok_s")
                else "",
            )
        )
    w2 = _get(results.get("w2"), "ms_per_output_token")
    if w2:
        rows.append(
            (
                "W2 batch-1 ms/output token",
                w2,
                f"roofline {ROOFLINE['w2_ms_per_tok']} ms, vLLM {VLLM['w2_ms_per_tok']} ms, "
                f"HF {hf.get('hf_step_ms', 0):.1f} ms",
            )
        )
    for key, label in (
        ("w3_c256", "c=256"),
        ("w3_c16", "c=16"),
        ("w3_api1_c256", "c=256 1 API server"),
        ("w3_thread_c256", "c=256 thread"),
        ("w3_api2_c256", "c=256 2 API servers"),
        ("w3_api2_c16", "c=16 2 API servers"),
        ("w3_api4_c256", "c=256 4 API servers"),
    ):
        r = results.get(key)
        if r:
            conc = label
            ratio = f"{r['output_tokens_per_s'] / w1:.0%} of W1" if w1 else ""
            rows.append((f"W3 {conc} output tok/s", r["output_tokens_per_s"], ratio))
            rows.append(
                (
                    f"W3 {conc} TTFT p50/p99 ms",
                    f"{r['ttft_ms']['p50']:.0f} / {r['ttft_ms']['p99']:.0f}",
                    "",
                )
            )
            rows.append(
                (
                    f"W3 {conc} TPOT p50/p99 ms",
                    f"{r['tpot_ms']['p50']:.2f} / {r['tpot_ms']['p99']:.2f}",
                    "",
                )
            )
    w4 = _get(results.get("w4"), "output_tokens_per_s")
    if w4:
        rows.append(("W4 nano-vllm output tok/s", w4, f"vLLM-class ~{VLLM['w4_tok_s']:.0f}"))
    pre = _get(results.get("prefix"), "output_tokens_per_s")
    if pre:
        rows.append(("W1 + 400-token shared prefix tok/s", pre, ""))
    for key, label in (("llama8b_w2", "Llama-8B W2 ms/token"), ("llama8b_w1", "Llama-8B W1")):
        r = results.get(key)
        if r:
            value = r.get("ms_per_output_token") or r.get("output_tokens_per_s")
            rows.append((label, value, ""))
    rows += _extra_rows(results)
    corr = results.get("correctness")
    if corr:
        rows.append(
            ("Triton kernel tests", "pass" if corr.get("triton_tests_pass") else "FAIL", "")
        )
        rows.append(
            (
                "Greedy parity triton vs reference",
                corr.get("greedy_match", "?"),
                f"max logprob diff {corr.get('max_logprob_diff', '?')}",
            )
        )
    width = max((len(r[0]) for r in rows), default=10)
    print("\n" + "=" * 80)
    for label, value, note in rows:
        text = f"{value:,.2f}" if isinstance(value, float) else str(value)
        print(f"{label:<{width}}  {text:>14}  {note}")
    print("=" * 80, flush=True)


def _extra_rows(results: dict[str, Any]) -> list[tuple[str, Any, str]]:
    rows: list[tuple[str, Any, str]] = []
    gil = results.get("w3_gil")
    if gil and "gil_held_fraction" in gil:
        rows.append(("W3 c=256 GIL held (server)", f"{gil['gil_held_fraction']:.0%}", ""))
    for run in _get(results.get("masks"), "runs") or []:
        rows.append(
            (
                f"masking batch {run['batch']} fwd {run['forward_ms']} ms: ms/step plain / schema",
                f"{run['ms_per_step_plain_p50']:.2f} / {run['ms_per_step_json_p50']:.2f}",
                f"+{run['masking_overhead_ms_p50']:.2f} ms ({run['masking_overhead_pct']:.1f}%), "
                f"host {run['json_host_ms_p50']:.2f} ms",
            )
        )
    for key, r in (results.get("quant") or {}).items():
        if key.startswith("q_") and isinstance(r, dict):
            value = r.get("ms_per_output_token") or r.get("output_tokens_per_s") or "failed"
            note = f"weights {r.get('weights_gib', '?')} GiB, KV {r.get('kv_tokens', '?')} tokens"
            rows.append((key, value, note))
    return rows


if __name__ == "__main__":
    os.environ.setdefault("NCCL_NVLS_ENABLE", "0")
    main()
