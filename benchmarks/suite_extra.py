"""GPU-suite parts beyond W1-W4: quantization at the engine level, structured-output
masking, and a GIL profile of the server under load. Imported by ``gpu_suite.py``.

``quant`` runs ``engine bench`` with bf16, online FP8 and AWQ (random 4-bit weights from
``--load-format dummy`` with an AutoAWQ ``quantization_config``) for the Qwen3-0.6B and
Llama-3.1-8B shapes, plus ``--kv-cache-dtype fp8``; it reads the weights memory and the KV
capacity from each run's log and runs ``quant_gpu.py`` (kernel correctness and speed).
"""

from __future__ import annotations

import collections
import json
import shutil
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

Bench = Callable[[Path, str, list[str]], "dict[str, Any] | None"]
Run = Callable[[list[str], Path, int], tuple[int, float]]

AWQ_CONFIG = {
    "quant_method": "awq",
    "bits": 4,
    "group_size": 128,
    "zero_point": True,
    "version": "gemm",
}


def awq_variant(model: Path) -> Path:
    """A copy of a config-only model folder whose config declares AutoAWQ 4-bit."""
    dst = model.with_name(model.name + "-awq")
    if dst.exists():
        shutil.rmtree(dst)
    shutil.copytree(model, dst)
    config = json.loads((dst / "config.json").read_text())
    config["quantization_config"] = AWQ_CONFIG
    (dst / "config.json").write_text(json.dumps(config, indent=2))
    return dst


def engine_facts(record: dict[str, Any] | None) -> dict[str, Any]:
    """Weights memory and KV capacity from a bench record, in GiB for the table."""
    facts = dict((record or {}).get("engine") or {})
    for key in ("weights_bytes", "kv_cache_bytes"):
        if facts.get(key):
            facts[key.replace("_bytes", "_gib")] = round(facts[key] / 2**30, 3)
    return facts


def part_quant(
    out: Path, qwen: Path, llama: Path, n: str, bench: Bench, run: Run
) -> dict[str, Any]:
    common = ["--load-format", "dummy", "--dtype", "bfloat16"]
    w1 = ["throughput", "--num-prompts", n, "--input-len", "512", "--output-len", "256"]
    w2 = ["latency", "--batch-size", "1", "--input-len", "128", "--output-len", "256",
          "--num-iters", "2", "--num-iters-warmup", "1"]  # fmt: skip
    awq_qwen, awq_llama = awq_variant(qwen), awq_variant(llama)
    fp8, kvfp8 = ["--quantization", "fp8"], ["--kv-cache-dtype", "fp8"]
    # Most telling first (a run cut short by the device's time limit loses the least):
    # batch-1 decode of the 8B shape (weight-bandwidth bound: where 8 and 4 bits pay),
    # then KV capacity, then throughput.
    runs: list[tuple[str, Path, list[str], list[str]]] = [
        ("q_bf16_llama8b_w2", llama, [], w2),
        ("q_fp8_llama8b_w2", llama, fp8, w2),
        ("q_awq_llama8b_w2", awq_llama, [], w2),
        ("q_kvfp8_w1", qwen, kvfp8, w1),
        ("q_fp8_w2", qwen, fp8, w2),
        ("q_awq_w2", awq_qwen, [], w2),
        ("q_fp8_w1", qwen, fp8, w1),
        ("q_awq_w1", awq_qwen, [], w1),
    ]
    results: dict[str, Any] = {}
    for i, (label, model, flags, workload) in enumerate(runs):
        if i == 4:  # after the 8B decode runs and the KV capacity run
            results["kernels"] = _quant_kernels(out, run)
        args = [workload[0], "--model", str(model), *common, *flags, *workload[1:]]
        record = bench(out, label, args)
        results[label] = {**(record or {"failed": True}), **engine_facts(record)}
    return results


def _quant_kernels(out: Path, run: Run) -> dict[str, Any]:
    path = out / "quant_gpu.json"
    code, elapsed = run(
        [sys.executable, "benchmarks/quant_gpu.py", "--out", str(path), "--quick"],
        out / "quant_gpu.log",
        600,
    )
    return {"exit": code, "elapsed_s": elapsed, "json": path.name if path.exists() else None}


def part_masks(out: Path, tokenizer_dir: Path, run: Run) -> dict[str, Any]:
    path = out / "structured_masks.json"
    code, _ = run(
        [
            sys.executable,
            "benchmarks/structured_masks.py",
            "--device",
            "cuda",
            "--batch",
            "32,256",
            "--steps",
            "200",
            "--warmup",
            "20",
            "--forward-ms",
            "0,1",
            "--tokenizer-dir",
            str(tokenizer_dir),
            "--out",
            str(path),
        ],  # fmt: skip
        out / "structured_masks.log",
        600,
    )
    return json.loads(path.read_text()) if path.exists() else {"exit": code}


class GilProfile:
    """``py-spy record --gil`` of the server for ``duration`` seconds after ``delay``
    (when py-spy is installed): which thread holds the GIL, and how often anyone does."""

    def __init__(self, out: Path, pid: int, delay: float = 8.0, duration: int = 15) -> None:
        self.raw = out / "w3_gil_profile.txt"
        self.duration, self.rate = duration, 100
        exe = shutil.which("py-spy")
        self.proc: subprocess.Popen[bytes] | None = None
        if exe is None:
            return
        cmd = (
            f"sleep {delay}; exec {exe} record --gil --nonblocking -p {pid} "
            f"-d {duration} -r {self.rate} --format raw -o {self.raw}"
        )
        self.proc = subprocess.Popen(["bash", "-c", cmd], stdout=subprocess.DEVNULL,
                                     stderr=subprocess.DEVNULL)  # fmt: skip

    def summary(self) -> dict[str, Any] | None:
        if self.proc is None:
            return None
        try:
            self.proc.wait(timeout=self.duration + 60)
        except subprocess.TimeoutExpired:
            self.proc.kill()
        if not self.raw.exists():
            return {"error": "py-spy wrote nothing"}
        by_thread: collections.Counter[str] = collections.Counter()
        leaf: collections.Counter[str] = collections.Counter()
        for line in self.raw.read_text().splitlines():
            stack, _, count = line.rpartition(" ")
            frames = stack.split(";")
            by_thread[frames[0]] += int(count)
            leaf[f"{frames[0].split(':')[-1].strip()}: {frames[-1]}"] += int(count)
        possible = self.duration * self.rate
        return {
            "gil_held_fraction": sum(by_thread.values()) / possible,
            "by_thread_fraction": {k: v / possible for k, v in by_thread.most_common(6)},
            "top_leaf_frames": leaf.most_common(25),
        }
