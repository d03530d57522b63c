"""Decode GEMV micro-benchmark: the split-K W4A16 (AWQ) and W8A16 (FP8) GEMVs against the
paths they replace and bf16 cuBLAS, per projection shape and batch of 1 to 16 tokens.

Run on the GPU machine from the repository root; nothing needs installing (the tree's
``sdk``, ``core`` and plugin folders go first on ``sys.path``, as with
``PYTHONPATH=sdk:core:plugins/awq:plugins/fp8``)::

    python3 benchmarks/quant_gemv_gpu.py --out results/quant_gemv_gpu.json
    python3 benchmarks/quant_gemv_gpu.py --smoke     # CPU, Triton's interpreter, tiny shapes

Shapes: Llama-3.1-8B q/k/v (N 6144, K 4096), o (4096, 4096), gate/up (28672, 4096), down
(4096, 14336); Qwen3-0.6B q/k/v (4096, 1024), o (1024, 2048), gate/up (6144, 1024), down
(1024, 3072). Tokens 1, 2, 4, 8, 16. Weights random: AWQ 4-bit codes in the tiled layout,
group 128; FP8 e4m3 from a bf16 weight (std 0.02) per channel and in 128 x 128 blocks.

Columns (ms per call):

- ``bf16``: ``F.linear`` on the bf16 weight (cuBLAS);
- ``awq``: :func:`engine_awq.gemv.awq_gemv` with the default tile (what a layer runs),
  ``awq_fma`` / ``awq_dot`` each variant forced; ``awq_old``: the previous decode path (the
  W4A16 GEMM, ``fma`` up to 4 tokens, ``dot`` above; split-K parts added by a 2nd launch);
- ``fp8c`` / ``fp8b``: :func:`engine_fp8.gemv.fp8_gemv` per channel / per block (default
  tile), ``fp8c_fma`` / ``fp8c_dot`` forced; ``fp8c_old`` / ``fp8b_old``: the previous
  decode path (the W8A16 GEMM, ``fma`` up to 4 tokens).

Timing: each call is captured many times in one CUDA graph (decode runs in graphs, so the
launch gaps count), cycling through enough copies of the weights (each with its own
split-K counters, as layers have) to exceed the L2, so weights come from HBM; CUDA events
around several replays; the median of ``REPEATS`` measurements. ``GBps`` is the bytes a
call must move (weights, scales, zero points, activations, output) over its time; ``%``
compares with the 4.1 TB/s an H200 copies at.

Correctness: every column's output against ``x.float() @ W_deq.T`` in float32 (max
absolute and relative error), once eagerly and once from the replayed graph (two replays:
the split-K counters must come back to zero).

Sweep (``--sweep-s`` seconds at most, 0 to skip): tiles, warps, pipeline stages and
programs per multiprocessor of the new GEMVs at 1, 4 and 16 tokens; the best is printed
next to the default, to retune ``default_gemv_config`` and the ``GEMV_*`` thresholds.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
for _folder in ("plugins/fp8", "plugins/awq", "core", "sdk"):
    sys.path.insert(0, str(REPO / _folder))

import torch  # noqa: E402
from report import git_commit, table  # noqa: E402

SHAPES: dict[str, dict[str, tuple[int, int]]] = {  # name -> (N out, K in)
    "Llama-3.1-8B": {"qkv": (6144, 4096), "o": (4096, 4096), "gate_up": (28672, 4096),
                     "down": (4096, 14336)},
    "Qwen3-0.6B": {"qkv": (4096, 1024), "o": (1024, 2048), "gate_up": (6144, 1024),
                   "down": (1024, 3072)},
}  # fmt: skip
SMOKE_SHAPES = {"tiny": {"a": (72, 384), "b": (40, 256)}}
TOKENS = (1, 2, 4, 8, 16)
GROUP = 128
BLOCK = (128, 128)
COPY_BW_GBPS = 4100.0  # H200 HBM copy bandwidth
L2_BYTES = 256 << 20  # cycle through weight copies until this many bytes
MAX_COPIES = 256
MIN_CALLS = 200  # calls per captured graph
REPLAYS = 5
REPEATS = 3
TOLERANCE = 1e-2  # relative max error (bf16 output rounding, summation order)
TUNED_MIN_GAIN = 0.03  # a swept tile enters a table when this much faster than the default
OLD_FMA_MAX_TOKENS = 4  # the previous decode paths' CUDA-core range (AWQ and FP8)


class Timer:
    """ms per call of ``calls`` (run in order, repeated), by CUDA graph or, off CUDA, by
    the wall clock over one pass (a smoke test of the code path, not a measurement)."""

    def __init__(self, device: torch.device) -> None:
        self.cuda = device.type == "cuda"
        self.graphs: list[Any] = []

    def __call__(self, calls: list[Callable[[], torch.Tensor]]) -> tuple[float, list[Any]]:
        if not self.cuda:
            start = time.perf_counter()
            outs = [fn() for fn in calls]
            return (time.perf_counter() - start) * 1e3 / len(calls), outs
        repeat = max(1, -(-MIN_CALLS // len(calls)))
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):  # warm up (compiles) outside the capture
            for fn in calls:
                fn()
        torch.cuda.current_stream().wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            outs = [fn() for _ in range(repeat) for fn in calls]
        graph.replay()
        times = []
        for _ in range(REPEATS):
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            for _ in range(REPLAYS):
                graph.replay()
            end.record()
            torch.cuda.synchronize()
            times.append(start.elapsed_time(end) / (REPLAYS * repeat * len(calls)))
        self.graphs.append(graph)  # keeps the outputs' memory alive until the checks ran
        return statistics.median(times), outs[-len(calls) :]


class Projection:
    """One projection's weights in every format, their references and their copies."""

    def __init__(self, num_out: int, num_in: int, device: torch.device) -> None:
        from engine_awq.tiled import dequantize_tiled, pick_chunk
        from engine_fp8 import quant_ops

        gen = torch.Generator(device=device).manual_seed(num_out * 7 + num_in)
        self.num_out, self.num_in, self.device = num_out, num_in, device
        w = torch.randn(num_out, num_in, device=device, generator=gen) * 0.02
        self.bf16 = w.to(torch.bfloat16)
        chunk = pick_chunk(num_in, GROUP)
        assert chunk is not None
        num_groups = num_in // GROUP
        qweight = torch.randint(-(2**31), 2**31, (num_out, num_in // 8), device=device,
                                dtype=torch.int32, generator=gen)  # fmt: skip
        zeros = torch.randint(0, 16, (num_groups, num_out), device=device, generator=gen)
        scales = torch.rand(num_groups, num_out, device=device, generator=gen) * 4e-3 + 1e-3
        self.awq = (qweight, zeros.to(torch.uint8), scales.half(), chunk)
        self.refs = {"awq": dequantize_tiled(*self.awq[:3], GROUP, chunk, torch.float32).t()}
        qc, sc = quant_ops.quantize_per_channel(self.bf16)
        qb, sb = quant_ops.quantize_block(self.bf16, BLOCK)
        self.fp8 = {"c": (qc, sc, None), "b": (qb, sb, BLOCK)}
        self.refs["fp8c"] = quant_ops.dequantize(qc, sc)
        self.refs["fp8b"] = quant_ops.dequantize(qb, sb, torch.float32, BLOCK)
        self.refs["bf16"] = self.bf16.float()
        awq_bytes = qweight.numel() * 4 + zeros.numel() + scales.numel() * 2
        self.nbytes = {"awq": awq_bytes, "fp8c": qc.numel() + sc.numel() * 4}
        self.nbytes["fp8b"] = qb.numel() + sb.numel() * 4
        self.nbytes["bf16"] = self.bf16.numel() * 2
        self._copies: dict[str, list[Any]] = {}

    def copies(self, family: str) -> list[Any]:
        """Copies of one format's weights (and, for the GEMVs, each copy's counters)."""
        from engine_sdk.layers.split_k import split_k_locks

        if family not in self._copies:
            count = max(1, min(MAX_COPIES, -(-L2_BYTES // self.nbytes[family])))
            if self.device.type != "cuda":
                count = 1
            made = []
            for _ in range(count):
                if family == "awq":
                    tensors: tuple[Any, ...] = tuple(t.clone() for t in self.awq[:3])
                elif family == "bf16":
                    tensors = (self.bf16.clone(),)
                else:
                    q, s, _ = self.fp8[family[-1]]
                    tensors = (q.clone(), s)
                made.append((tensors, split_k_locks(-(-self.num_out // 16), self.device)))
            self._copies[family] = made
        return self._copies[family]


def methods(p: Projection, m: int) -> dict[str, tuple[str, Callable[[Any, Any, Any], Any]]]:
    """column -> (weight family, fn(x, tensors, locks)) for ``m`` tokens."""
    from engine_awq import gemv as awq_gemv_mod
    from engine_awq import w4a16
    from engine_fp8 import gemv as fp8_gemv_mod
    from engine_fp8 import w8a16

    chunk = p.awq[3]
    old = "fma" if m <= OLD_FMA_MAX_TOKENS else "dot"
    cols: dict[str, tuple[str, Callable[[Any, Any, Any], Any]]] = {
        "bf16": ("bf16", lambda x, t, lk: torch.nn.functional.linear(x, t[0])),
        "awq": ("awq", lambda x, t, lk: awq_gemv_mod.awq_gemv(x, *t, GROUP, chunk, None, None, lk)),
        "awq_old": ("awq", lambda x, t, lk: w4a16.awq_w4a16_gemm(
            x, *t, GROUP, chunk, None, w4a16.default_config(m, p.num_out, chunk, old))),
    }  # fmt: skip
    for variant in ("fma", "dot"):
        cfg = awq_gemv_mod.default_gemv_config(m, p.num_out, chunk, variant)
        cols[f"awq_{variant}"] = ("awq", lambda x, t, lk, c=cfg: awq_gemv_mod.awq_gemv(
            x, *t, GROUP, chunk, None, c, lk))  # fmt: skip
    for kind in ("c", "b"):
        block = p.fp8[kind][2]
        cols[f"fp8{kind}"] = (f"fp8{kind}", lambda x, t, lk, b=block: fp8_gemv_mod.fp8_gemv(
            x, *t, b, None, None, lk))  # fmt: skip
        old_cfg = w8a16.default_config(m, p.num_out, old, block)
        cols[f"fp8{kind}_old"] = (f"fp8{kind}", lambda x, t, lk, b=block, c=old_cfg: (
            w8a16.fp8_w8a16_gemm(x, *t, b, None, c)))  # fmt: skip
    for variant in ("fma", "dot"):
        cfg = fp8_gemv_mod.default_gemv_config(m, p.num_out, None, variant)
        cols[f"fp8c_{variant}"] = ("fp8c", lambda x, t, lk, c=cfg: fp8_gemv_mod.fp8_gemv(
            x, *t, None, None, c, lk))  # fmt: skip
    return cols


def _err(got: torch.Tensor, want: torch.Tensor) -> tuple[float, float]:
    diff = float((got.float() - want).abs().max())
    return diff, diff / max(float(want.abs().max()), 1e-30)


def measure(p: Projection, m: int, timer: Timer, errors: list[str]) -> dict[str, Any]:
    """One row: per column ms, GB/s, errors (eager and from the graph)."""
    x = torch.randn(m, p.num_in, device=p.device, dtype=torch.bfloat16)
    row: dict[str, Any] = {}
    wants = {family: x.float() @ ref.t() for family, ref in p.refs.items()}
    for col, (family, fn) in methods(p, m).items():
        want, copies = wants[family], p.copies(family)
        try:
            eager = fn(x, *copies[0])
            ms, outs = timer([lambda t=t, lk=lk, f=fn: f(x, t, lk) for t, lk in copies])
            graph_err = max(_err(out, want)[1] for out in outs)
            if timer.cuda:  # a second replay: the counters must have returned to zero
                timer.graphs[-1].replay()
                torch.cuda.synchronize()
                graph_err = max(graph_err, *(_err(out, want)[1] for out in outs))
        except Exception as exc:  # one kernel that fails must not end the run
            errors.append(f"{col} m={m} N={p.num_out} K={p.num_in}: {type(exc).__name__}: {exc}")
            print(f"  {errors[-1][:300]}", file=sys.stderr)
            row[col] = None
            continue
        abs_err, rel_err = _err(eager, want)
        nbytes = p.nbytes[family] + x.numel() * 2 + m * p.num_out * 2
        row[col] = ms
        row[f"{col}_GBps"] = nbytes / (ms * 1e-3) / 1e9
        row[f"{col}_err"] = {"abs": abs_err, "rel": rel_err, "graph_rel": graph_err,
                             "ok": max(rel_err, graph_err) <= TOLERANCE}  # fmt: skip
        if not row[f"{col}_err"]["ok"]:
            errors.append(f"{col} m={m} N={p.num_out} K={p.num_in}: rel error {rel_err:.3g}")
    return row


def sweep(p: Projection, m: int, timer: Timer, deadline: float, smoke: bool) -> list[dict]:
    """Time tiles / warps / stages / programs per SM of both GEMVs; rows with ms."""
    import triton
    from engine_awq import gemv as awq_gemv_mod
    from engine_fp8 import gemv as fp8_gemv_mod
    from engine_sdk.layers.split_k import num_multiprocessors, pick_split

    x = torch.randn(m, p.num_in, device=p.device, dtype=torch.bfloat16)
    sms, chunk = num_multiprocessors(p.device), p.awq[3]
    # CUDA cores at 1-2 tokens (the dot's 16-row side wastes most of its work there),
    # tensor cores from 2 tokens; FP8 likewise.
    awq_tiles = [("fma", 64, 2), ("fma", 64, 4), ("fma", 128, 2), ("fma", 128, 4),
                 ("fma", 256, 4), ("fma", 256, 8)] if m <= 2 else []  # fmt: skip
    awq_tiles += [("dot", 32, 4), ("dot", 64, 4), ("dot", 128, 4), ("dot", 128, 8)] if m > 1 else []
    fp8_tiles = [("fma", 64, 128, 4), ("fma", 32, 256, 4), ("fma", 128, 64, 4),
                 ("fma", 64, 256, 8), ("fma", 128, 128, 8)] if m == 1 else []  # fmt: skip
    fp8_tiles += [("dot", 64, 128, 4), ("dot", 128, 128, 8), ("dot", 64, 256, 4)] if m > 1 else []
    # The bf16 GEMV's shape (engine_sdk.layers.gemv.pick_tiles): a few weight rows per
    # program, long K chunks, no split (no partial sums, no counters): small projections.
    fp8_rows = [("fma", 2, 1024, 4), ("fma", 2, 2048, 4), ("fma", 4, 512, 4),
                ("fma", 4, 1024, 4), ("fma", 8, 512, 4)] if m <= 4 else []  # fmt: skip
    stages, per_sm = ((2, 4), (2, 4, 6, 8)) if not smoke else ((2,), (2,))
    rows: list[dict[str, Any]] = []
    jobs: list[tuple[str, Any, Callable[[Any, Any, Any], Any]]] = []
    for variant, bn, nw in awq_tiles[: 2 if smoke else None]:
        for st in stages:
            for pps in per_sm:
                split = pick_split(-(-p.num_out // bn), p.num_in // chunk, pps * sms)[0]
                cfg = awq_gemv_mod.GemvConfig(variant, bn, nw, st, split)
                jobs.append(("awq", {**cfg._asdict(), "per_sm": pps},
                             lambda xx, t, lk, c=cfg: awq_gemv_mod.awq_gemv(
                                 xx, *t, GROUP, chunk, None, c, lk)))  # fmt: skip
    for variant, bn, bk, nw in fp8_tiles[: 2 if smoke else None]:
        for st in stages:
            for pps in per_sm:
                split = pick_split(-(-p.num_out // bn), -(-p.num_in // bk), pps * sms)[0]
                cfg = fp8_gemv_mod.GemvConfig(variant, bn, bk, nw, st, split)
                jobs.append(("fp8c", {**cfg._asdict(), "per_sm": pps},
                             lambda xx, t, lk, c=cfg: fp8_gemv_mod.fp8_gemv(
                                 xx, *t, None, None, c, lk)))  # fmt: skip
    for variant, bn, bk, nw in fp8_rows[: 1 if smoke else None]:
        for st in (1, 2):
            cfg = fp8_gemv_mod.GemvConfig(
                variant, bn, min(bk, triton.next_power_of_2(p.num_in)), nw, st, 1
            )
            jobs.append(("fp8c", {**cfg._asdict(), "per_sm": 0},
                         lambda xx, t, lk, c=cfg: fp8_gemv_mod.fp8_gemv(
                             xx, *t, None, None, c, lk)))  # fmt: skip
    for family, cfg_dict, fn in jobs:
        if time.time() > deadline:
            break
        try:
            ms, _ = timer([lambda t=t, lk=lk, f=fn: f(x, t, lk) for t, lk in p.copies(family)])
        except Exception as exc:
            ms = None
            print(f"  sweep {family} {cfg_dict}: {type(exc).__name__}: {str(exc)[:200]}",
                  file=sys.stderr)  # fmt: skip
        rows.append({"kernel": family, "tokens": m, "config": cfg_dict, "ms": ms})
    return rows


COLUMNS = ("bf16", "awq", "awq_old", "awq_fma", "awq_dot", "fp8c", "fp8c_old", "fp8c_fma",
           "fp8c_dot", "fp8b", "fp8b_old")  # fmt: skip


def _summary(speed: list[dict[str, Any]]) -> str:
    """Per row: ms and % of copy bandwidth of the defaults, and the old paths' ms."""
    out = []
    for r in speed:
        row = {k: r[k] for k in ("model", "proj", "tokens")}
        for col in COLUMNS:
            row[col] = r.get(col)
        for col in ("bf16", "awq", "fp8c", "fp8b"):
            gbps = r.get(f"{col}_GBps")
            row[f"{col}%"] = None if gbps is None else 100 * gbps / COPY_BW_GBPS
        out.append(row)
    return table(out, list(out[0]) if out else [])


def write_tuned(
    folder: Path,
    best: dict[tuple, dict[str, Any]],
    speed: list[dict[str, Any]],
    projections: dict[tuple[str, str], Projection],
) -> None:
    """The tile tables the plugins read (``engine_sdk.layers.split_k.tuned_config``): per
    plugin, ``"kernel,N,K,tokens"`` -> the sweep's best tile, kept only where it beat the
    default tile (the ``awq`` / ``fp8c`` column at those tokens) by ``TUNED_MIN_GAIN``."""
    from engine_sdk.layers.split_k import tuned_file_name

    defaults = {(r["model"], r["proj"], r["tokens"]): r for r in speed}
    tables: dict[str, dict[str, Any]] = {"engine_awq": {}, "engine_fp8": {}}
    for (model, proj, tokens, kernel), r in sorted(best.items()):
        default_ms = (defaults.get((model, proj, tokens)) or {}).get(kernel)
        if default_ms is None or r["ms"] > default_ms * (1 - TUNED_MIN_GAIN):
            continue
        p = projections[(model, proj)]
        config = {k: v for k, v in r["config"].items() if k != "per_sm"}
        name = f"awq_c{p.awq[3]}" if kernel == "awq" else "fp8"
        package = "engine_awq" if kernel == "awq" else "engine_fp8"
        tables[package][f"{name},{p.num_out},{p.num_in},{tokens}"] = {
            **config, "ms": round(r["ms"], 5), "default_ms": round(default_ms, 5)}  # fmt: skip
    device = torch.cuda.get_device_name()
    for package, configs in tables.items():
        out = folder / package / tuned_file_name(device)
        out.parent.mkdir(parents=True, exist_ok=True)
        payload = {"device": device, "written_by": " ".join(sys.argv), "git_commit": git_commit(),
                   "date": time.strftime("%Y-%m-%d"), "configs": configs}  # fmt: skip
        out.write_text(json.dumps(payload, indent=1) + "\n")
        print(f"wrote {out}: {len(configs)} tiles")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", help="JSON file to write")
    parser.add_argument("--smoke", action="store_true", help="CPU, interpreter, tiny shapes")
    parser.add_argument("--sweep-s", type=float, default=150.0, help="sweep budget (0: skip)")
    parser.add_argument("--tokens", help="token counts, comma-separated (default 1,2,4,8,16)")
    parser.add_argument("--models", help="models to time, comma-separated (default: both)")
    parser.add_argument("--sweep-tokens", default="1,4,16", help="token counts to sweep")
    parser.add_argument("--write-tuned", help="folder: write <plugin>/<device>.json tile tables")
    args = parser.parse_args()
    if args.smoke:
        from engine_sdk.testing.triton_interpreter import enable

        enable()  # before the kernel modules are imported
        device, shapes, tokens = torch.device("cpu"), SMOKE_SHAPES, (1, 3, 16)
    elif not torch.cuda.is_available():
        print("error: needs a CUDA GPU (or --smoke)", file=sys.stderr)
        return 2
    else:
        device, shapes, tokens = torch.device("cuda"), SHAPES, TOKENS
        torch.backends.cuda.matmul.allow_tf32 = False  # float32 references in float32
    if args.tokens:
        tokens = tuple(int(t) for t in args.tokens.split(","))
    if args.models:
        shapes = {name: shapes[name] for name in args.models.split(",")}
    import triton

    started = time.time()
    timer, errors = Timer(device), []
    speed: list[dict[str, Any]] = []
    sweep_rows: list[dict[str, Any]] = []
    projections: dict[tuple[str, str], Projection] = {}
    with torch.inference_mode():
        for model, projs in shapes.items():
            for name, (num_out, num_in) in projs.items():
                print(f"{model} {name} (N {num_out}, K {num_in}) ...", flush=True)
                p = projections[(model, name)] = Projection(num_out, num_in, device)
                for m in tokens:
                    base = {"model": model, "proj": name, "N": num_out, "K": num_in, "tokens": m}
                    speed.append({**base, **measure(p, m, timer, errors)})
                    got = {k: round(v, 4) for k, v in speed[-1].items() if k in COLUMNS and v}
                    print("   ", m, got, flush=True)
                    timer.graphs.clear()
                if device.type == "cuda":
                    torch.cuda.empty_cache()
        deadline = time.time() + args.sweep_s
        sweep_tokens = (1, 16) if args.smoke else tuple(map(int, args.sweep_tokens.split(",")))
        for m in sweep_tokens:  # every projection at one token count before the next count
            for (model, name), p in projections.items():
                if time.time() > deadline:
                    break
                rows = sweep(p, m, timer, deadline, args.smoke)
                sweep_rows += [{"model": model, "proj": name, **r} for r in rows]
                timer.graphs.clear()
    print("\n== ms per call (CUDA graph, weights from HBM); % of 4.1 TB/s ==")
    print(_summary(speed))
    errs = [(r["model"], r["proj"], r["tokens"], k[:-4], v) for r in speed
            for k, v in r.items() if k.endswith("_err")]  # fmt: skip
    bad = [e for e in errs if not e[4]["ok"]]
    worst = max(errs, key=lambda e: max(e[4]["rel"], e[4]["graph_rel"]), default=None)
    print(f"\n== correctness: {len(errs) - len(bad)} of {len(errs)} within {TOLERANCE} relative"
          f" (eager and graph replays); worst: {worst} ==")  # fmt: skip
    for e in bad:
        print(f"  FAILED {e}")
    if sweep_rows:
        print("\n== sweep: best config per (model, proj, tokens, kernel) ==")
        best: dict[tuple, dict[str, Any]] = {}
        for r in sweep_rows:
            key = (r["model"], r["proj"], r["tokens"], r["kernel"])
            if r["ms"] is not None and (key not in best or r["ms"] < best[key]["ms"]):
                best[key] = r
        print(table(list(best.values()), ["model", "proj", "tokens", "kernel", "ms", "config"]))
        if args.write_tuned:
            write_tuned(Path(args.write_tuned), best, speed, projections)
    payload = {
        "command": " ".join(sys.argv),
        "git_commit": git_commit(),
        "device": torch.cuda.get_device_name() if device.type == "cuda" else "cpu (smoke)",
        "torch": torch.__version__,
        "triton": triton.__version__,
        "date": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "seconds": time.time() - started,
        "timing": f"CUDA graph of >= {MIN_CALLS} calls over weight copies (>= {L2_BYTES >> 20}"
        f" MiB, at most {MAX_COPIES}); median of {REPEATS} x {REPLAYS} replays; CUDA events",
        "copy_bandwidth_GBps": COPY_BW_GBPS,
        "speed": speed,
        "sweep": sweep_rows,
        "errors": errors,
    }
    if args.out:
        out = Path(args.out)
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps(payload, indent=1, default=str))
        print(f"wrote {out}")
    print(f"done in {time.time() - started:.0f} s; {len(errors)} errors")
    return 1 if bad or errors else 0


if __name__ == "__main__":
    sys.exit(main())
