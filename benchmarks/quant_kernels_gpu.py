"""Quantized GEMM kernels on the GPU: correctness against the dequantized references and
speed against the previous kernels and bf16 cuBLAS, per projection shape and token count.

Run on the GPU machine from the repository root; the tree's source folders are put first
on ``sys.path``, so nothing needs installing (under 4 minutes on an H200)::

    python3 benchmarks/quant_kernels_gpu.py --out $OUT/quant_kernels_gpu.json [--no-sweep]

Shapes: the merged q/k/v, o, merged gate/up and down projections of Llama-3.1-8B and
Qwen3-0.6B; tokens 1, 2, 4, 8, 16, 32, 128, 512. Weights random (bf16, std 0.02); AWQ
group 128 (``awq_quantize``), FP8 e4m3 per tensor, per channel and 128x128 blocks.

1. correctness (relative max error against ``x.float() @ W_deq.T`` in float32, bound 1e-2):
   the AWQ layer (whatever path it picks), the W4A16 ``fma`` and ``dot`` variants and the
   dequantize pass; the FP8 W8A16 kernel with each scale layout.
2. speed, ms per call from CUDA-graph replays (decode runs in graphs). Each method cycles
   through enough copies of its weights to exceed the 60 MB L2, so weights come from HBM
   as in a model. Columns: ``bf16`` (F.linear), ``awq_old`` (the previous Triton kernel,
   ``engine_awq.triton_gemm``, checkpoint layout), ``awq`` (the layer: the path in
   ``awq_path``), ``awq_fma`` / ``awq_dot`` / ``awq_deq`` (each path forced), ``fp8_w8a8``
   and ``fp8_ch_w8a8`` (the ``_scaled_mm`` path as before: per-tensor, and per-channel as
   merged layers run it), ``fp8`` (the layer: ``fp8_path``), ``w8a16_t`` / ``_c`` / ``_b``
   (the W8A16 kernel, per tensor / channel / block; ``w8a16_c_fma`` / ``_dot`` the variant
   not picked by default), and the weight-read bandwidth of ``awq`` and ``fp8`` in TB/s.
3. sweep (skipped with ``--no-sweep`` or when time runs short): tile sizes, warps and
   programs per multiprocessor of the new kernels at 1 and 16 tokens on the 8B gate/up
   and down shapes; the best is printed next to the default.
"""

from __future__ import annotations

import argparse
import copy
import json
import platform
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
for _folder in ("plugins/fp8", "plugins/awq", "sdk"):
    sys.path.insert(0, str(REPO / _folder))

import torch  # noqa: E402
import triton  # noqa: E402
from engine_awq import method as awq_method  # noqa: E402
from engine_awq import w4a16  # noqa: E402
from engine_awq.config import AwqConfig  # noqa: E402
from engine_awq.packing import awq_dequantize, awq_quantize  # noqa: E402
from engine_awq.tiled import dequantize_tiled  # noqa: E402
from engine_awq.triton_gemm import awq_gemm_triton  # noqa: E402
from engine_fp8 import method as fp8_method  # noqa: E402
from engine_fp8 import quant_ops, w8a16  # noqa: E402
from engine_fp8.config import Fp8Config  # noqa: E402
from engine_sdk.layers.linear import Linear  # noqa: E402
from report import git_commit as _git_commit  # noqa: E402
from report import table as _table  # noqa: E402

SHAPES: dict[str, dict[str, tuple[int, int]]] = {  # name -> (in, out)
    "Llama-3.1-8B": {"qkv": (4096, 6144), "o": (4096, 4096), "gate_up": (4096, 28672),
                     "down": (14336, 4096)},
    "Qwen3-0.6B": {"qkv": (1024, 4096), "o": (2048, 1024), "gate_up": (1024, 6144),
                   "down": (3072, 1024)},
}  # fmt: skip
TOKENS = (1, 2, 4, 8, 16, 32, 128, 512)
GROUP = 128
BLOCK = (128, 128)
TOLERANCE = 1e-2
L2_BYTES = 192 << 20  # cycle through copies until this many weight bytes: past the L2
MAX_COPIES = 64
MIN_CALLS = 64  # calls per captured graph
REPLAYS = 5
DEVICE = torch.device("cuda")
DTYPE = torch.bfloat16
SWEEP_DEADLINE_S = 150.0  # skip the sweep if the main part took longer
TIMING_DEADLINE_S = 200.0  # past this, only correctness runs (the whole run stays < 4 min)


# -- timing ---------------------------------------------------------------------------


def graph_ms(calls: list[Callable[[], Any]]) -> float | None:
    """ms per call: ``calls`` in order, repeated to ``MIN_CALLS``, captured in one CUDA graph."""
    repeat = max(1, -(-MIN_CALLS // len(calls)))
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for fn in calls:
            fn()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    try:
        with torch.cuda.graph(graph):
            for _ in range(repeat):
                for fn in calls:
                    fn()
    except RuntimeError as exc:
        print(f"  graph capture failed: {exc}", file=sys.stderr)
        return None
    graph.replay()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    torch.cuda.synchronize()
    start.record()
    for _ in range(REPLAYS):
        graph.replay()
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end) / (REPLAYS * repeat * len(calls))


def num_copies(nbytes: int) -> int:
    return max(1, min(MAX_COPIES, -(-L2_BYTES // max(nbytes, 1))))


ERRORS: list[str] = []  # kernels that failed to compile or run (the run goes on)


def timed(make: Callable[[int], Callable[[], Any]], nbytes: int) -> float | None:
    """Time ``make(i)()`` over enough copies ``i`` of the weights to miss the L2; None
    (and the error in ``ERRORS``) when it fails."""
    try:
        return graph_ms([make(i) for i in range(num_copies(nbytes))])
    except Exception as exc:  # a config that does not compile must not end the run
        ERRORS.append(f"timing: {type(exc).__name__}: {str(exc)[:300]}")
        print(f"  {ERRORS[-1]}", file=sys.stderr)
        torch.cuda.synchronize()
        return None


def checked(name: str, fn: Callable[[], torch.Tensor], want: torch.Tensor) -> dict[str, Any]:
    """``{"kernel", "rel_err"}``; ``rel_err`` inf (and the error kept) when ``fn`` fails."""
    try:
        return {"kernel": name, "rel_err": _rel(fn(), want)}
    except Exception as exc:
        ERRORS.append(f"{name}: {type(exc).__name__}: {str(exc)[:300]}")
        print(f"  {ERRORS[-1]}", file=sys.stderr)
        return {"kernel": name, "rel_err": float("inf"), "error": ERRORS[-1]}


def _rel(got: torch.Tensor, want: torch.Tensor) -> float:
    return float((got.float() - want).abs().max() / want.abs().max())


# -- one shape ------------------------------------------------------------------------


class Shape:
    """The weights of one projection in every format, and their copies for timing."""

    def __init__(self, num_in: int, num_out: int) -> None:
        gen = torch.Generator(device=DEVICE).manual_seed(num_in * 7 + num_out)
        self.num_in, self.num_out = num_in, num_out
        self.w = torch.randn(num_out, num_in, device=DEVICE, dtype=DTYPE, generator=gen) * 0.02
        self.awq_ckpt = awq_quantize(self.w.float(), GROUP)  # qweight, qzeros, scales
        self.awq = self._awq_layer()
        self.awq_ref = dequantize_tiled(
            self.awq.tiled_qweight, self.awq.tiled_zeros, self.awq.scales, GROUP,
            self.awq.awq_chunk, torch.float32,
        ).t()  # fmt: skip
        self.fp8 = self._fp8_layer({})
        self.fp8_ch = self._fp8_layer(
            {"weight_strategy": "channel", "activation_strategy": "token"}
        )
        self.block_q, self.block_s = quant_ops.quantize_block(self.w, BLOCK)
        self.fp8_refs = {
            "t": quant_ops.dequantize(self.fp8.weight, self.fp8.weight_scale),
            "c": quant_ops.dequantize(self.fp8_ch.weight, self.fp8_ch.weight_scale),
            "b": quant_ops.dequantize(self.block_q, self.block_s, torch.float32, BLOCK),
        }
        self.awq_bytes = self.awq.tiled_qweight.numel() * 4 + self.awq.scales.numel() * 3
        self.fp8_bytes = num_out * num_in
        self._copies: dict[str, list[Any]] = {}

    def _awq_layer(self) -> Linear:
        cfg = AwqConfig.from_config({"quant_method": "awq", "bits": 4, "group_size": GROUP})
        with torch.device(DEVICE):
            layer = Linear(self.num_in, self.num_out, False, cfg, "bench.awq", DTYPE)
        for name, tensor in zip(("qweight", "qzeros", "scales"), self.awq_ckpt, strict=True):
            getattr(layer, name).data.copy_(tensor)
        layer.quant_method.process_weights_after_loading(layer)
        assert layer.awq_chunk == 128, "expected the tiled layout on CUDA"
        return layer

    def _fp8_layer(self, config: dict[str, Any]) -> Linear:
        with torch.device(DEVICE):
            layer = Linear(self.num_in, self.num_out, False, Fp8Config.from_config(config), "bench.fp8", DTYPE)  # fmt: skip  # noqa: E501
        layer.weight.data.copy_(self.w)
        layer.quant_method.process_weights_after_loading(layer)
        return layer

    def copies(self, key: str, nbytes: int, make: Callable[[], Any]) -> list[Any]:
        if key not in self._copies:
            self._copies[key] = [make() for _ in range(num_copies(nbytes))]
        return self._copies[key]


def _awq_args(layer: Linear) -> tuple:
    return (layer.tiled_qweight, layer.tiled_zeros, layer.scales, GROUP, layer.awq_chunk)


def check_shape(s: Shape, m: int, x: torch.Tensor) -> list[dict[str, Any]]:
    rows = []
    awq_want = x.float() @ s.awq_ref.t()
    cands: dict[str, Callable[[], torch.Tensor]] = {"awq_layer": lambda: s.awq(x)}
    if m <= 16:
        cands["awq_fma"] = lambda: w4a16.awq_w4a16_gemm(
            x, *_awq_args(s.awq), None, w4a16.default_config(m, s.num_out, 128, "fma")
        )
    cands["awq_dot"] = lambda: w4a16.awq_w4a16_gemm(
        x, *_awq_args(s.awq), None, w4a16.default_config(m, s.num_out, 128, "dot")
    )
    cands["awq_deq"] = lambda: x @ w4a16.awq_w4a16_dequantize(*_awq_args(s.awq), DTYPE).t()
    for name, fn in cands.items():
        rows.append(checked(name, fn, awq_want))
    if m == 1:  # the load-time repack: exactly the checkpoint's weight
        ckpt = awq_dequantize(*s.awq_ckpt, GROUP, torch.float32).t()
        rows.append({"kernel": "awq_repack", "rel_err": _rel(s.awq_ref, ckpt)})
    for kind, (weight, scale, block) in _fp8_weights(s).items():
        want = x.float() @ s.fp8_refs[kind].t()
        for variant in ("fma", "dot") if m <= 16 else ("dot",):
            cfg = w8a16.default_config(m, s.num_out, variant, block)
            rows.append(
                checked(
                    f"w8a16_{kind}_{variant}",
                    lambda weight=weight, scale=scale, block=block, cfg=cfg: w8a16.fp8_w8a16_gemm(
                        x, weight, scale, block, None, cfg
                    ),
                    want,
                )
            )
    for row in rows:
        row["ok"] = row["rel_err"] <= TOLERANCE
    return rows


def _fp8_weights(s: Shape) -> dict[str, tuple]:
    return {
        "t": (s.fp8.weight, s.fp8.weight_scale, None),
        "c": (s.fp8_ch.weight, s.fp8_ch.weight_scale, None),
        "b": (s.block_q, s.block_s, BLOCK),
    }


def time_shape(s: Shape, m: int, x: torch.Tensor) -> dict[str, Any]:
    row: dict[str, Any] = {}
    bf16 = s.copies("bf16", s.w.numel() * 2, lambda: s.w.clone())
    row["bf16"] = timed(lambda i: lambda: torch.nn.functional.linear(x, bf16[i]), s.w.numel() * 2)
    if m <= 256:
        old = s.copies("awq_old", s.awq_bytes, lambda: [t.clone() for t in s.awq_ckpt])
        row["awq_old"] = timed(lambda i: lambda: awq_gemm_triton(x, *old[i], GROUP), s.awq_bytes)
    awq = s.copies("awq", s.awq_bytes, lambda: copy.deepcopy(s.awq))
    row["awq_path"] = awq_method.select_path(s.awq, m, DTYPE)
    row["awq"] = timed(lambda i: lambda: awq[i](x), s.awq_bytes)
    variants = (["fma"] if m <= 16 else []) + (["dot"] if m <= 512 else [])
    for variant in variants:
        cfg = w4a16.default_config(m, s.num_out, 128, variant)
        row[f"awq_{variant}"] = timed(
            lambda i, cfg=cfg: lambda: w4a16.awq_w4a16_gemm(x, *_awq_args(awq[i]), None, cfg),
            s.awq_bytes,
        )
    row["awq_deq"] = timed(
        lambda i: lambda: x @ w4a16.awq_w4a16_dequantize(*_awq_args(awq[i]), DTYPE).t(),
        s.awq_bytes,
    )
    fp8 = s.copies("fp8", s.fp8_bytes, lambda: copy.deepcopy(s.fp8))
    fp8_w8a8 = s.copies("fp8_w8a8", s.fp8_bytes, lambda: _without_w8a16(s.fp8))
    row["fp8_path"] = fp8_method.select_path(s.fp8, m, DTYPE)
    row["fp8"] = timed(lambda i: lambda: fp8[i](x), s.fp8_bytes)
    row["fp8_w8a8"] = timed(lambda i: lambda: fp8_w8a8[i](x), s.fp8_bytes)
    ch_w8a8 = s.copies("fp8_ch_w8a8", s.fp8_bytes, lambda: _without_w8a16(s.fp8_ch))
    row["fp8_ch_w8a8"] = timed(lambda i: lambda: ch_w8a8[i](x), s.fp8_bytes)
    if m <= 256:
        default = "fma" if m <= fp8_method.W8A16_FMA_MAX_TOKENS else "dot"
        for kind, (weight, scale, block) in _fp8_weights(s).items():
            ws = s.copies(f"w8a16_{kind}", s.fp8_bytes, lambda weight=weight: weight.clone())
            # Per channel (what merged layers run) both variants up to 16 tokens.
            for variant in ("fma", "dot") if kind == "c" and m <= 16 else (default,):
                cfg = w8a16.default_config(m, s.num_out, variant, block)
                column = f"w8a16_{kind}" if variant == default else f"w8a16_{kind}_{variant}"
                row[column] = timed(
                    lambda i, ws=ws, scale=scale, block=block, cfg=cfg: (
                        lambda: w8a16.fp8_w8a16_gemm(x, ws[i], scale, block, None, cfg)
                    ),
                    s.fp8_bytes,
                )
    for name, nbytes in (("awq", s.awq_bytes), ("fp8", s.fp8_bytes)):
        if row.get(name):
            row[f"{name}_TBps"] = nbytes / (row[name] * 1e-3) / 1e12
    return row


def _without_w8a16(layer: Linear) -> Linear:
    clone = copy.deepcopy(layer)
    clone.fp8_w8a16 = False
    return clone


# -- sweep ----------------------------------------------------------------------------


def _sweep_configs(
    base: dict[str, Any],
    module: Any,
    configs: list[Any],
    call: Callable[[int, Any], Callable[[], Any]],
    nbytes: int,
) -> list[dict[str, Any]]:
    """Time ``call(copy, config)`` for each config and programs-per-SM target of ``module``."""
    rows = []
    default = module.PROGRAMS_PER_SM
    for cfg in configs:
        for per_sm in (2, 4, 8):
            module.PROGRAMS_PER_SM = per_sm
            ms = timed(lambda i, cfg=cfg: call(i, cfg), nbytes)
            rows.append({**base, "config": cfg._asdict(), "programs_per_sm": per_sm, "ms": ms})
    module.PROGRAMS_PER_SM = default
    return rows


def sweep(shapes: dict[tuple[str, str], Shape]) -> list[dict[str, Any]]:
    rows: list[dict[str, Any]] = []
    for key in (("Llama-3.1-8B", "gate_up"), ("Llama-3.1-8B", "down")):
        s = shapes[key]
        awq = s.copies("awq", s.awq_bytes, lambda s=s: copy.deepcopy(s.awq))
        fp8 = s.copies("w8a16_c", s.fp8_bytes, lambda s=s: s.fp8_ch.weight.clone())
        scale = s.fp8_ch.weight_scale
        for m in (1, 16):
            x = torch.randn(m, s.num_in, device=DEVICE, dtype=DTYPE)
            bm = triton.next_power_of_2(m)
            base = {"model": key[0], "shape": key[1], "tokens": m}
            awq_cfgs = [
                w4a16.GemmConfig("fma", bm, bn, nw)
                for bn in (32, 64, 128, 256)
                for nw in (4, 8)
                if bm * bn * 16 <= 16384
            ]
            awq_cfgs += [w4a16.GemmConfig("dot", 16, bn, nw) for bn in (64, 128) for nw in (4, 8)]
            rows += _sweep_configs(
                {**base, "kernel": "awq"}, w4a16, awq_cfgs,
                lambda i, cfg, x=x, awq=awq: lambda: w4a16.awq_w4a16_gemm(
                    x, *_awq_args(awq[i]), None, cfg
                ),
                s.awq_bytes,
            )  # fmt: skip
            fp8_cfgs = [
                w8a16.GemmConfig("fma", bm, bn, bk, nw)
                for bn, bk in ((32, 64), (64, 64), (128, 64), (64, 128), (128, 32))
                for nw in (4, 8)
                if bm * bn * bk <= 16384
            ]
            fp8_cfgs += [
                w8a16.GemmConfig("dot", 16, bn, bk, 4) for bn in (64, 128) for bk in (64, 128)
            ]
            rows += _sweep_configs(
                {**base, "kernel": "w8a16_c"}, w8a16, fp8_cfgs,
                lambda i, cfg, x=x, fp8=fp8, scale=scale: lambda: w8a16.fp8_w8a16_gemm(
                    x, fp8[i], scale, None, None, cfg
                ),
                s.fp8_bytes,
            )  # fmt: skip
    return rows


# -- driver ---------------------------------------------------------------------------


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", required=True, help="JSON file to write")
    parser.add_argument("--no-sweep", action="store_true", help="skip the tile sweep")
    args = parser.parse_args()
    if not torch.cuda.is_available():
        print("error: needs a CUDA GPU", file=sys.stderr)
        return 2
    started = time.time()
    correctness, speed = [], []
    shapes: dict[tuple[str, str], Shape] = {}
    with torch.inference_mode():
        for model, projections in SHAPES.items():
            for name, (num_in, num_out) in projections.items():
                print(f"{model} {name} ({num_in} -> {num_out}) ...", flush=True)
                s = shapes[(model, name)] = Shape(num_in, num_out)
                for m in TOKENS:
                    x = torch.randn(m, num_in, device=DEVICE, dtype=DTYPE)
                    base = {
                        "model": model,
                        "shape": name,
                        "in": num_in,
                        "out": num_out,
                        "tokens": m,
                    }
                    correctness += [{**base, **r} for r in check_shape(s, m, x)]
                    if time.time() - started < TIMING_DEADLINE_S:
                        speed.append({**base, **time_shape(s, m, x)})
                    else:
                        ERRORS.append(f"timing skipped (time budget): {model} {name} {m}")
                torch.cuda.empty_cache()
        main_s = time.time() - started
        sweep_rows: list[dict[str, Any]] = []
        if not args.no_sweep and main_s < SWEEP_DEADLINE_S:
            print(f"sweep (main part took {main_s:.0f} s) ...", flush=True)
            sweep_rows = sweep(shapes)
    for row in speed:
        for name in ("awq", "fp8"):
            if row.get(name) and row.get("bf16"):
                row[f"{name}_vs_bf16"] = row["bf16"] / row[name]

    failed = [r for r in correctness if not r["ok"]]
    print(f"\n== correctness: {len(correctness) - len(failed)} of {len(correctness)} within "
          f"{TOLERANCE} (relative max error vs the dequantized reference) ==")  # fmt: skip
    worst: dict[str, dict[str, Any]] = {}
    for r in correctness:
        if r["kernel"] not in worst or r["rel_err"] > worst[r["kernel"]]["rel_err"]:
            worst[r["kernel"]] = r
    print(_table(list(worst.values()), ["kernel", "rel_err", "model", "shape", "tokens", "ok"]))
    if failed:
        print("\nfailed:\n" + _table(failed, ["model", "shape", "tokens", "kernel", "rel_err"]))
    print("\n== ms per call (CUDA graph, weights from HBM) ==")
    keys = ["model", "shape", "tokens", "bf16", "awq_old", "awq", "awq_path", "awq_fma"]
    keys += ["awq_dot", "awq_deq", "awq_TBps", "awq_vs_bf16", "fp8_w8a8", "fp8_ch_w8a8", "fp8"]
    keys += ["fp8_path", "w8a16_t", "w8a16_c", "w8a16_c_fma", "w8a16_c_dot", "w8a16_b"]
    keys += ["fp8_TBps", "fp8_vs_bf16"]
    print(_table(speed, keys))
    if sweep_rows:
        print("\n== sweep: best config per (shape, tokens, kernel) ==")
        best: dict[tuple, dict[str, Any]] = {}
        for r in sweep_rows:
            k = (r["model"], r["shape"], r["tokens"], r["kernel"])
            if r["ms"] is not None and (k not in best or r["ms"] < best[k]["ms"]):
                best[k] = r
        print(_table(list(best.values()), ["model", "shape", "tokens", "kernel", "ms", "config",
                                           "programs_per_sm"]))  # fmt: skip
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
        "timing": f"CUDA graph of >= {MIN_CALLS} calls over copies of the weights "
        f"(>= {L2_BYTES >> 20} MiB, at most {MAX_COPIES}), {REPLAYS} replays, CUDA events",
        "defaults": {
            "awq_fma_max_tokens": awq_method.FMA_MAX_TOKENS,
            "awq_dot_max_tokens": awq_method.DOT_MAX_TOKENS,
            "w8a16_max_tokens": fp8_method.W8A16_MAX_TOKENS,
            "w8a16_fma_max_tokens": fp8_method.W8A16_FMA_MAX_TOKENS,
            "programs_per_sm": w4a16.PROGRAMS_PER_SM,
        },
        "correctness": correctness,
        "speed": speed,
        "sweep": sweep_rows,
        "errors": ERRORS,
    }
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(payload, indent=2))
    if ERRORS:
        print(f"\n{len(ERRORS)} error(s):\n" + "\n".join(ERRORS[:20]))
    print(f"\nwrote {out} in {payload['seconds']:.0f} s; {len(failed)} check(s) failed")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
