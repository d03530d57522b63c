"""Merged q/k/v and gate/up projections on the GPU: bf16, FP8 and AWQ, separate vs merged.

Run on the GPU machine from the repository root (the tree's packages installed, or the
script falls back to the source folders)::

    python3 benchmarks/quant_merge_gpu.py --out results/quant_merge_gpu.json

For the projection groups of a Qwen3-0.6B-like and a Llama-3.1-8B-like layer (hidden
1024 / 4096; q/k/v 2048+1024+1024 / 4096+1024+1024; gate/up 2x3072 / 2x14336) and 1 to 256
tokens, each method runs its layers one by one ("separate", what an unmerged model does)
and as one merged layer (``merge_linears``, what the loader builds). Methods: bf16; fp8
(online: per-tensor weight scales, dynamic per-tensor activations); fp8_ch (per-channel
weight scales, dynamic per-token activations, the compressed-tensors FP8_DYNAMIC layout);
awq (4-bit, group 128, Triton dequantize-GEMM). Per call, in ms, from CUDA events:

- ``eager``: 50 calls back to back after 10 warm-up calls (includes launch overhead);
- ``graph``: the calls captured in a CUDA graph (10 per graph, 10 replays after warm-up),
  as decode runs in the engine.

Every merged output is checked against the concatenated separate outputs (relative max
error; the merged layer quantizes the same activations once, so only output rounding and
split-K order differ). Also timed: the activation quantization alone, Triton kernel vs the
torch ops it replaces (and checked bit for bit against them). Prints tables and writes one
JSON (command, GPU, versions).
"""

from __future__ import annotations

import argparse
import json
import platform
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch  # noqa: E402
import triton  # noqa: E402
from engine_awq.config import AwqConfig  # noqa: E402
from engine_awq.packing import awq_quantize  # noqa: E402
from engine_fp8 import quant_ops, triton_quant  # noqa: E402
from engine_fp8.config import Fp8Config  # noqa: E402
from engine_sdk.layers.linear import Linear, merge_linears  # noqa: E402

# quant_gpu (this folder) puts the tree's source folders on sys.path when the packages are
# not installed, and has the table and commit helpers.
from quant_gpu import _git_commit, _table  # noqa: E402

SHAPES: dict[str, dict[str, Any]] = {
    "Qwen3-0.6B": {"hidden": 1024, "qkv": (2048, 1024, 1024), "gate_up": (3072, 3072)},
    "Llama-3.1-8B": {"hidden": 4096, "qkv": (4096, 1024, 1024), "gate_up": (14336, 14336)},
}
TOKENS = (1, 8, 32, 128, 256)
ACT_TOKENS = (1, 2, 4, 8, 16, 32, 128, 256)
METHODS = ("bf16", "fp8", "fp8_ch", "awq")
TOLERANCE = {"bf16": 1e-2, "fp8": 2e-2, "fp8_ch": 2e-2, "awq": 2e-2}
EAGER_WARMUP, EAGER_ITERS = 10, 50
GRAPH_CALLS, GRAPH_REPLAYS = 10, 10
DEVICE = torch.device("cuda")
DTYPE = torch.bfloat16


# -- layers ---------------------------------------------------------------------------


def make_layer(method: str, num_in: int, num_out: int, w: torch.Tensor) -> Linear:
    quant = {
        "bf16": None,
        "fp8": Fp8Config.from_config({}),
        "fp8_ch": Fp8Config.from_config(
            {"weight_strategy": "channel", "activation_strategy": "token"}
        ),
        "awq": AwqConfig.from_config({"quant_method": "awq", "bits": 4, "group_size": 128}),
    }[method]
    with torch.device(DEVICE):
        layer = Linear(num_in, num_out, False, quant, f"bench.{method}", DTYPE)
    if method == "awq":
        qweight, qzeros, scales = awq_quantize(w.float(), 128)
        layer.qweight.data.copy_(qweight)
        layer.qzeros.data.copy_(qzeros)
        layer.scales.data.copy_(scales)
    else:
        layer.weight.data.copy_(w)
    layer.quant_method.process_weights_after_loading(layer)
    return layer


# -- timing ---------------------------------------------------------------------------


def eager_ms(fn: Callable[[], Any]) -> float:
    for _ in range(EAGER_WARMUP):
        fn()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    torch.cuda.synchronize()
    start.record()
    for _ in range(EAGER_ITERS):
        fn()
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end) / EAGER_ITERS


def graph_ms(fn: Callable[[], Any]) -> float | None:
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(3):
            fn()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    try:
        with torch.cuda.graph(graph):
            for _ in range(GRAPH_CALLS):
                fn()
    except RuntimeError as exc:
        print(f"  graph capture failed: {exc}", file=sys.stderr)
        return None
    for _ in range(3):
        graph.replay()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    torch.cuda.synchronize()
    start.record()
    for _ in range(GRAPH_REPLAYS):
        graph.replay()
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end) / (GRAPH_REPLAYS * GRAPH_CALLS)


def _rel(got: torch.Tensor, want: torch.Tensor) -> float:
    return float((got.float() - want.float()).abs().max() / want.float().abs().max())


# -- one projection group -----------------------------------------------------------------


def bench_group(model: str, group: str, num_in: int, outs: tuple[int, ...]) -> list[dict]:
    gen = torch.Generator(device=DEVICE).manual_seed(0)
    weights = [
        torch.randn(n, num_in, device=DEVICE, dtype=DTYPE, generator=gen) * 0.02 for n in outs
    ]
    xs = {m: torch.randn(m, num_in, device=DEVICE, dtype=DTYPE, generator=gen) for m in TOKENS}
    base = {"model": model, "group": group, "in": num_in, "outs": "+".join(map(str, outs))}
    rows = []
    for method in METHODS:
        rows += [{**base, **row} for row in bench_method(method, num_in, weights, xs)]
        torch.cuda.empty_cache()
    return rows


def bench_method(
    method: str, num_in: int, weights: list[torch.Tensor], xs: dict[int, torch.Tensor]
) -> list[dict]:
    layers = [make_layer(method, num_in, w.shape[0], w) for w in weights]

    def run_separate(x: torch.Tensor) -> None:
        for layer in layers:
            layer(x)

    separate: dict[int, dict[str, Any]] = {}
    with torch.inference_mode():
        for m, x in xs.items():
            separate[m] = {
                "out": torch.cat([layer(x) for layer in layers], dim=-1),
                "eager": eager_ms(lambda x=x: run_separate(x)),
                "graph": graph_ms(lambda x=x: run_separate(x)),
            }
    merged = merge_linears(layers)  # the originals now view the merged tensors
    rows = []
    for m, x in xs.items():
        row: dict[str, Any] = {
            "tokens": m,
            "method": method,
            "merged_ok": merged is not None,
            "sep_eager_ms": separate[m]["eager"],
            "sep_graph_ms": separate[m]["graph"],
        }
        if merged is not None:
            with torch.inference_mode():
                err = _rel(merged(x), separate[m]["out"])
                row["merged_eager_ms"] = eager_ms(lambda x=x: merged(x))
                row["merged_graph_ms"] = graph_ms(lambda x=x: merged(x))
            row["rel_err_merged_vs_separate"] = err
            row["merged_ok"] = err <= TOLERANCE[method]
        rows.append(row)
    return rows


def bench_activation_quant() -> list[dict]:
    """Each way of quantizing activations, alone; per tensor also with the small-batch
    path (every program reads all rows) forced on and off, to place its threshold."""
    rows = []
    small_rows = triton_quant.SMALL_TENSOR_ROWS
    for num_cols in (1024, 4096, 14336):
        for m in ACT_TOKENS:
            x = torch.randn(m, num_cols, device=DEVICE, dtype=DTYPE)
            row: dict[str, Any] = {"K": num_cols, "tokens": m}
            for name, ops in (("torch", quant_ops), ("triton", triton_quant)):
                row[f"token_{name}_us"] = _us(lambda ops=ops, x=x: ops.quantize_per_token(x))
                row[f"tensor_{name}_us"] = _us(lambda ops=ops, x=x: ops.quantize_per_tensor(x))
            for name, threshold in (("all_rows", 1 << 30), ("atomic", 0)):
                triton_quant.SMALL_TENSOR_ROWS = threshold
                row[f"tensor_{name}_us"] = _us(lambda x=x: triton_quant.quantize_per_tensor(x))
            triton_quant.SMALL_TENSOR_ROWS = small_rows
            exact = True
            for strategy in ("token", "tensor"):
                q, s = getattr(triton_quant, f"quantize_per_{strategy}")(x)
                rq, rs = getattr(quant_ops, f"quantize_per_{strategy}")(x)
                exact &= torch.equal(q.view(torch.uint8), rq.view(torch.uint8))
                exact &= torch.equal(s.reshape(-1), rs.reshape(-1))
            row["bit_exact"] = bool(exact)
            rows.append(row)
    return rows


def _us(fn: Callable[[], Any]) -> float:
    ms = graph_ms(fn)
    return float("nan") if ms is None else 1e3 * ms


# -- driver ---------------------------------------------------------------------------


def _summary(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """One line per (model, group, tokens): graph-mode ms of each method, separate/merged."""
    out: dict[tuple, dict[str, Any]] = {}
    for r in rows:
        line = out.setdefault(
            (r["model"], r["group"], r["tokens"]),
            {"model": r["model"], "group": r["group"], "tokens": r["tokens"]},
        )
        line[f"{r['method']}_sep"] = r["sep_graph_ms"]
        line[f"{r['method']}_mrg"] = r.get("merged_graph_ms")
    return list(out.values())


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", required=True, help="JSON file to write")
    args = parser.parse_args()
    if not torch.cuda.is_available():
        print("error: needs a CUDA GPU", file=sys.stderr)
        return 2
    started = time.time()
    rows = []
    for model, shape in SHAPES.items():
        for group in ("qkv", "gate_up"):
            print(f"{model} {group} ...", flush=True)
            rows += bench_group(model, group, shape["hidden"], shape[group])
    act_rows = bench_activation_quant()
    keys = ["model", "group", "tokens", "method", "sep_eager_ms", "merged_eager_ms"]
    keys += ["sep_graph_ms", "merged_graph_ms", "rel_err_merged_vs_separate", "merged_ok"]
    print("\n== separate vs merged, ms per call (eager: back-to-back; graph: CUDA graph) ==")
    print(_table(rows, keys))
    print("\n== graph-mode ms per call, all methods ==")
    summary_keys = ["model", "group", "tokens"]
    summary_keys += [f"{m}_{k}" for m in METHODS for k in ("sep", "mrg")]
    print(_table(_summary(rows), summary_keys))
    print("\n== activation quantization to fp8, us per call (CUDA graph) ==")
    print(
        _table(
            act_rows,
            ["K", "tokens", "token_torch_us", "token_triton_us", "tensor_torch_us"]
            + ["tensor_triton_us", "tensor_all_rows_us", "tensor_atomic_us", "bit_exact"],
        )
    )
    payload = {
        "command": " ".join(sys.argv),
        "git_commit": _git_commit(),
        "gpu": torch.cuda.get_device_name(),
        "capability": ".".join(map(str, torch.cuda.get_device_capability())),
        "torch": torch.__version__,
        "triton": triton.__version__,
        "python": platform.python_version(),
        "date": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "seconds": time.time() - started,
        "timing": {
            "eager": f"{EAGER_ITERS} calls after {EAGER_WARMUP} warm-up, CUDA events",
            "graph": f"{GRAPH_CALLS} calls per CUDA graph, {GRAPH_REPLAYS} replays, CUDA events",
        },
        "rows": rows,
        "activation_quant": act_rows,
    }
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(payload, indent=2))
    failed = [r for r in rows if not r["merged_ok"]] + [r for r in act_rows if not r["bit_exact"]]
    print(f"\nwrote {out} in {payload['seconds']:.0f} s; {len(failed)} check(s) failed")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
