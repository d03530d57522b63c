"""W3 serving, Engine and vLLM in the same run, each server measured with both clients.

Figures on the GPU machine move 10-25% between runs, so a serving ratio only counts when
both servers ran in one call. Run on the GPU machine from the repository root after the
vLLM anchor is unpacked (``../shared/vllm-anchor``: ``$HOME/v/env.sh``, ``$VLLM_MODEL``):

    python3 benchmarks/serve_side_by_side.py --parts w3 --out $OUT/w3.json
    python3 benchmarks/serve_side_by_side.py --parts sweep --engine-only --model DIR --out F

Parts:
- ``w3``: Engine's default server and ``vllm serve`` (its defaults), both loading the same
  folder with dummy weights, each driven by Engine's client (``engine bench serve``, four
  client processes) and by ``vllm bench serve``, at concurrency 256 (1024 prompts) and 16
  (256 prompts), 512 tokens in and 256 out (``--loads``, ``--input-len``, ``--output-len``
  change them); plus Engine's offline W1 for the server-over-offline share.
- ``sweep``: Engine with ``--api-server-count`` 1, 2, 4 and 8 at concurrency 256 (Engine's
  client), to pick the default from a measurement.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import signal
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any

from side_by_side import sh  # benchmarks/ is sys.path[0] when run as a script

HOME = Path(os.environ.get("HOME", "/root"))
VENV = f"source {HOME}/v/env.sh"
ENGINE_EXTRA: list[str] = []
LENGTHS = {"input_len": 512, "output_len": 256}  # W3's (--input-len/--output-len change them)


def log_cmd(cmd: str) -> None:
    print("$", cmd, flush=True)


def wait_healthy(proc: subprocess.Popen[bytes], port: int, timeout: float) -> bool:
    deadline = time.time() + timeout
    while time.time() < deadline:
        if proc.poll() is not None:
            return False
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2) as r:
                if r.status == 200:
                    return True
        except OSError:
            time.sleep(1)
    return False


def start(cmd: str, log: Path, port: int, timeout: float) -> tuple[subprocess.Popen[bytes], float]:
    log_cmd(cmd)
    began = time.perf_counter()
    proc = subprocess.Popen(
        ["bash", "-c", cmd], stdout=log.open("w"), stderr=subprocess.STDOUT, start_new_session=True
    )
    if not wait_healthy(proc, port, timeout):
        stop(proc)
        print("\n".join(log.read_text().splitlines()[-15:]), flush=True)
        raise RuntimeError(f"server did not come up: {cmd}")
    startup = time.perf_counter() - began
    print(f"  up in {startup:.0f} s", flush=True)
    return proc, startup


def stop(proc: subprocess.Popen[bytes]) -> None:
    try:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(60)
    except (ProcessLookupError, subprocess.TimeoutExpired):
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


def engine_client(work: Path, name: str, port: int, conc: int, prompts: int) -> dict[str, Any]:
    result = work / f"{name}.json"
    cmd = (
        f"{sys.executable} -m engine.cli.main bench serve --base-url http://127.0.0.1:{port}/v1 "
        f"--num-prompts {prompts} --input-len {LENGTHS['input_len']} "
        f"--output-len {LENGTHS['output_len']} --max-concurrency {conc} "
        f"--num-workers 4 --save-result {result}"
    )
    code, _ = sh(cmd, work / f"{name}.log", 400)
    if code or not result.exists():
        return {"command": cmd, "exit": code}
    data = json.loads(result.read_text())
    return {
        "command": cmd,
        "output_tokens_per_s": data["output_tokens_per_s"],
        "ttft_p50_ms": data["ttft_ms"]["p50"],
        "ttft_p99_ms": data["ttft_ms"]["p99"],
        "tpot_p50_ms": data["tpot_ms"]["p50"],
        "tpot_p99_ms": data["tpot_ms"]["p99"],
        "failed": data["failed"],
    }


def vllm_client(
    work: Path, name: str, port: int, conc: int, prompts: int, model: Path
) -> dict[str, Any]:
    cmd = (
        f"({VENV}; vllm bench serve --base-url http://127.0.0.1:{port} --model {model} "
        f"--dataset-name random --random-input-len {LENGTHS['input_len']} "
        f"--random-output-len {LENGTHS['output_len']} "
        f"--num-prompts {prompts} --max-concurrency {conc} --ignore-eos "
        f"--percentile-metrics ttft,tpot,itl --metric-percentiles 50,99 "
        f"--save-result --result-dir {work} --result-filename {name}.json)"
    )
    code, text = sh(cmd, work / f"{name}.log", 400)
    found: dict[str, Any] = {"command": cmd, "exit": code}
    path = work / f"{name}.json"
    if path.exists():
        data = json.loads(path.read_text())
        keys = {
            "output_tokens_per_s": "output_throughput",
            "ttft_p50_ms": "p50_ttft_ms",
            "ttft_p99_ms": "p99_ttft_ms",
            "tpot_p50_ms": "p50_tpot_ms",
            "tpot_p99_ms": "p99_tpot_ms",
        }
        found.update({k: data[v] for k, v in keys.items() if v in data})
        found["failed"] = data.get("num_prompts", prompts) - data.get("completed", prompts)
        return found
    patterns = {
        "output_tokens_per_s": r"Output token throughput \(tok/s\):\s+([\d.]+)",
        "ttft_p50_ms": r"P50 TTFT \(ms\):\s+([\d.]+)",
        "ttft_p99_ms": r"P99 TTFT \(ms\):\s+([\d.]+)",
        "tpot_p50_ms": r"P50 TPOT \(ms\):\s+([\d.]+)",
    }
    for key, pattern in patterns.items():
        m = re.search(pattern, text)
        if m:
            found[key] = float(m.group(1))
    return found


def measure(
    work: Path, tag: str, port: int, model: Path, loads: tuple[tuple[int, int], ...],
    clients: tuple[str, ...],
) -> dict[str, Any]:  # fmt: skip
    rows: dict[str, Any] = {}
    for conc, prompts in loads:
        for client in clients:
            name = f"{tag}_{client}_c{conc}"
            if client == "engine_client":
                rows[name] = engine_client(work, name, port, conc, prompts)
            else:
                rows[name] = vllm_client(work, name, port, conc, prompts, model)
    return rows


def engine_server(model: Path, port: int, extra: str = "") -> str:
    return (
        f"exec {sys.executable} -m engine.cli.main serve {model} --load-format dummy "
        f"--dtype bfloat16 --port {port} --served-model-name {model} {extra} "
        + " ".join(ENGINE_EXTRA)
    )


def vllm_server(model: Path, port: int) -> str:
    return (
        f"{VENV}; exec vllm serve {model} --load-format dummy --dtype bfloat16 "
        f"--host 127.0.0.1 --port {port}"
    )


def with_server(
    cmd: str, log: Path, port: int, timeout: float, body: Callable[[], dict[str, Any]]
) -> dict[str, Any]:
    try:
        proc, startup = start(cmd, log, port, timeout)
    except RuntimeError as exc:
        return {"server": cmd, "error": str(exc)}
    try:
        return {"server": cmd, "startup_s": startup, **body()}
    finally:
        stop(proc)


def offline_w1(work: Path, model: Path, prompts: int) -> dict[str, Any]:
    result = work / "w1_offline.json"
    cmd = (
        f"{sys.executable} -m engine.cli.main bench throughput --model {model} "
        f"--load-format dummy --dtype bfloat16 --num-prompts {prompts} "
        f"--input-len {LENGTHS['input_len']} --output-len {LENGTHS['output_len']} "
        f"--save-result {result} " + " ".join(ENGINE_EXTRA)
    )
    code, _ = sh(cmd, work / "w1_offline.log", 300)
    if code or not result.exists():
        return {"command": cmd, "exit": code}
    return {"command": cmd, **json.loads(result.read_text())}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--parts", default="w3")
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--engine-only", action="store_true", help="skip vLLM")
    parser.add_argument("--model", type=Path, help="Qwen3-0.6B-shaped folder ($VLLM_MODEL)")
    parser.add_argument("--counts", default="1,2,4,8", help="sweep: --api-server-count values")
    parser.add_argument("--loads", default="256:1024,16:256", help="concurrency:prompts,...")
    parser.add_argument("--input-len", type=int, default=512)
    parser.add_argument("--output-len", type=int, default=256)
    parser.add_argument("--engine-extra", default="", help="more `engine serve` flags")
    args = parser.parse_args()
    ENGINE_EXTRA.append(args.engine_extra)
    LENGTHS.update(input_len=args.input_len, output_len=args.output_len)
    loads = tuple(tuple(int(x) for x in pair.split(":")) for pair in args.loads.split(","))
    first = (loads[0],)
    work = Path("/tmp/serve_sbs")
    work.mkdir(exist_ok=True)
    model = args.model or Path(os.environ.get("VLLM_MODEL", str(HOME / "v/model")))
    table: dict[str, Any] = {"date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())}
    commit = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True)
    table["commit"] = commit.stdout.strip() or os.environ.get("ENGINE_COMMIT", "")
    clients = ("engine_client",) if args.engine_only else ("engine_client", "vllm_client")

    def save() -> None:
        args.out.write_text(json.dumps(table, indent=1))

    for part in args.parts.split(","):
        if part == "sweep":
            for count in args.counts.split(","):
                key = f"engine_api{count}"
                table[key] = with_server(
                    engine_server(model, 8011, f"--api-server-count {count}"),
                    work / f"{key}.log", 8011, 300,
                    lambda k=key: measure(work, k, 8011, model, first, ("engine_client",)),
                )  # fmt: skip
                save()
        elif part == "w3":
            table["engine_offline_w1"] = offline_w1(work, model, loads[0][1])
            save()
            table["engine"] = with_server(
                engine_server(model, 8011), work / "engine_server.log", 8011, 300,
                lambda: measure(work, "engine", 8011, model, loads, clients),
            )  # fmt: skip
            save()
            if not args.engine_only:
                table["vllm"] = with_server(
                    vllm_server(model, 8012), work / "vllm_server.log", 8012, 420,
                    lambda: measure(work, "vllm", 8012, model, loads, clients),
                )  # fmt: skip
                save()
        else:
            raise SystemExit(f"unknown part {part!r}")
    print_table(table)


def print_table(table: dict[str, Any]) -> None:
    print("\nserver/client/concurrency          out tok/s  TTFT p50  TTFT p99  TPOT p50  failed")
    for rows in table.values():
        if not isinstance(rows, dict) or "server" not in rows:
            continue
        for name, r in rows.items():
            if not isinstance(r, dict) or "command" not in r:
                continue
            cells = [r.get(k, float("nan")) for k in (
                "output_tokens_per_s", "ttft_p50_ms", "ttft_p99_ms", "tpot_p50_ms")]  # fmt: skip
            print(f"{name:34s} {cells[0]:9.0f} {cells[1]:9.1f} {cells[2]:9.1f} {cells[3]:9.2f}"
                  f"  {r.get('failed', '?')}")  # fmt: skip
    w1 = table.get("engine_offline_w1", {}).get("output_tokens_per_s")
    if w1:
        print(f"Engine offline W1: {w1:.0f} output tok/s")


if __name__ == "__main__":
    main()
