"""Row-GEMV tiles at batch 1: the four launches a decoder layer runs per token, timed for
bf16, FP8 and AWQ weights with their default tiles, and a tile sweep of the AWQ row GEMV
(:mod:`engine_awq.rows`) and of the SDK's row GEMV on float8 weights.

Run on the GPU machine from the repository root (nothing needs installing: the tree's
``sdk``, ``core`` and plugin folders go first on ``sys.path``)::

    python3 benchmarks/rows_gemv_gpu.py --out $OUT/rows_gemv.json --write-tuned $OUT/tuned
    python3 benchmarks/rows_gemv_gpu.py --smoke      # CPU, Triton's interpreter, tiny shapes

Launches per layer (the decoder's at one token): ``qkv`` with the add+RMSNorm prologue,
``o`` plain, ``gate_up`` with the prologue and the SiLU epilogue (the merged ``[gate | up]``
weight, ``2 I`` rows), ``down`` plain. Columns (us per call): ``bf16`` and ``fp8`` the
SDK's GEMV (``engine_sdk.layers.gemv``; FP8 with one float32 scale per row, as online
``--quantization fp8`` stores it), ``awq`` the AWQ row GEMV with the built-in default tile
(:class:`engine_awq.rows.RowsTile`), ``*_best`` the sweep's fastest tile; ``%`` the bytes a
call must move over its time against the copy rate (``--copy-gbps``: 4100 for an H200,
3350 for an H100).

Timing: :class:`quant_gemv_gpu.Timer` (each call captured many times in one CUDA graph over
weight copies that exceed the L2, so weights come from HBM; the median of replays). Every
swept tile's output is checked against the default tile's (relative error at most
``TOLERANCE``): a tile that computes something else is dropped, not timed.

The sweep (``--sweep-s`` seconds at most, shared out evenly over the launches still to
sweep) takes two passes per launch: columns a program x activations a step at Triton's
default warps and stages, then warps x the K loop's pipeline stages
(``RowsTile.loop_stages``: 0, 2, 3) at the best pair. ``--write-tuned DIR`` writes
``DIR/engine_awq/<device>.json``: the plugin's table for
this GPU (kept rows of the tree's table, plus ``awq_rows_<launch>_c<chunk>,N,K,1`` for each
launch whose best tile beat the default by ``TUNED_MIN_GAIN``), which
:func:`engine_awq.rows.rows_tile` reads once copied to ``plugins/awq/engine_awq/tuned/``.
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

import quant_gemv_gpu  # noqa: E402
import torch  # noqa: E402
from report import git_commit, table  # noqa: E402

# model -> (hidden, q/k/v rows, attention output K, intermediate)
MODELS = {
    "Llama-3.1-8B": (4096, 6144, 4096, 14336),
    "Qwen3-0.6B": (1024, 4096, 2048, 3072),
}
SMOKE_MODELS = {"tiny": (256, 384, 256, 384)}
GROUP = quant_gemv_gpu.GROUP  # the group size of Projection's AWQ weights
TOLERANCE = 1e-2
TUNED_MIN_GAIN = 0.03
EPS = 1e-6
AWQ_PAIRS = [(bn, bk) for bn in (2, 4, 8, 16) for bk in (1024, 2048, 4096)]
# the second pass: warps x the K loop's pipeline stages (RowsTile.loop_stages; the launch's
# num_stages, swept here before round 18, does not pipeline the loop)
AWQ_OPTIONS = [(w, s) for w in (2, 4, 8) for s in (0, 2, 3)]
FP8_TILES = [(bn, bk, w) for bn in (1, 2, 4, 8) for bk in (512, 1024, 2048) for w in (4, 8)]
FP8_BLOCK_NS = (1, 2, 4, 8)  # the add+RMSNorm / gated launches take only their rows a program
# engine_awq.wide tiles (columns a program, activations a step); gated: the gate columns
WIDE_TILES = [(bn, bk) for bn in (4, 8, 16) for bk in (2048, 4096)]
WIDE_GATED_TILES = [(bn, bk) for bn in (1, 2, 4, 8) for bk in (2048, 4096)]


def launches(hidden: int, qkv: int, attn: int, inter: int) -> list[tuple[str, str, int, int]]:
    """(projection, launch kind, weight rows, K) of one decoder layer."""
    return [("qkv", "norm", qkv, hidden), ("o", "plain", hidden, attn),
            ("gate_up", "gated", 2 * inter, hidden), ("down", "plain", hidden, inter)]  # fmt: skip


# this script's format names -> quant_gemv_gpu.Projection's weight families (FP8 with one
# float32 scale per row, as online --quantization fp8 stores it)
FAMILIES = {"bf16": "bf16", "fp8": "fp8c", "awq": "awq", "wide": "awq"}


def copies(p: Any, family: str) -> list[tuple[torch.Tensor, ...]]:
    """The weight copies (``quant_gemv_gpu.Projection.copies``, enough to exceed the L2)
    of one format, without the split-K counters the row GEMVs do not use."""
    return [tensors for tensors, _ in p.copies(FAMILIES[family])]


def call(family: str, kind: str, p: Any, acts: tuple, tile: Any) -> Callable[[tuple], Any]:
    """fn(weight copy) -> output for one format and launch kind; ``tile``: an AWQ
    ``RowsTile``, an FP8 plain ``(block_n, block_k, warps)`` or an FP8 norm/gated
    ``block_n`` (None: the default). ``p``: the launch's ``quant_gemv_gpu.Projection``."""
    from engine_awq import rows
    from engine_sdk.layers import gemv

    x, residual, nw = acts
    gated = kind == "gated"
    if family in ("awq", "wide"):
        if kind == "plain":
            return lambda t: rows.awq_rows(x, *t, GROUP, p.awq[3], None, tile)
        return lambda t: rows.awq_rows_add_rms_norm(
            x, residual, nw, EPS, *t, GROUP, p.awq[3], None, gated, tile
        )[0]
    scale = (lambda t: t[1]) if family == "fp8" else (lambda t: None)
    if kind == "plain":
        return lambda t: gemv.gemv(x, t[0], None, tile, scale=scale(t))

    def norm(t: tuple) -> Any:
        saved = gemv.FP8_BLOCK_N, gemv.FP8_GATED_BLOCK_N
        if tile is not None:  # module constants, read at the launch
            gemv.FP8_BLOCK_N = gemv.FP8_GATED_BLOCK_N = tile
        try:
            out = gemv.gemv_add_rms_norm(x, residual, nw, EPS, t[0], gated=gated, scale=scale(t))
            return out[0]
        finally:
            gemv.FP8_BLOCK_N, gemv.FP8_GATED_BLOCK_N = saved

    return norm


def rel_err(got: torch.Tensor, want: torch.Tensor) -> float:
    diff = float((got.float() - want.float()).abs().max())
    return diff / max(float(want.float().abs().max()), 1e-30)


def main() -> int:  # noqa: PLR0915
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", help="JSON file to write")
    parser.add_argument("--smoke", action="store_true", help="CPU, interpreter, tiny shapes")
    parser.add_argument("--models", help="models, comma-separated (default: both)")
    parser.add_argument("--sweep-s", type=float, default=240.0, help="sweep budget (0: skip)")
    parser.add_argument("--copy-gbps", type=float, default=4100.0, help="the GPU's copy rate")
    parser.add_argument("--write-tuned", help="folder: write engine_awq/<device>.json")
    args = parser.parse_args()
    if args.smoke:
        from engine_sdk.testing.triton_interpreter import enable

        enable()  # before the kernel modules are imported
        device, models = torch.device("cpu"), SMOKE_MODELS
    elif not torch.cuda.is_available():
        print("error: needs a CUDA GPU (or --smoke)", file=sys.stderr)
        return 2
    else:
        device, models = torch.device("cuda"), MODELS
    if args.models:
        models = {name: models[name] for name in args.models.split(",")}
    import triton
    from engine_awq import wide
    from engine_awq.rows import RowsTile

    timer = quant_gemv_gpu.Timer(device)
    started = time.time()
    sweep_end = started + args.sweep_s
    left = sum(len(launches(*dims)) for dims in models.values())
    results: list[dict[str, Any]] = []
    sweeps: list[dict[str, Any]] = []
    errors: list[str] = []

    def timed(family: str, kind: str, p: Any, acts: tuple, tile: Any, want: Any) -> Any:
        fn = call(family, kind, p, acts, tile)
        try:
            if want is not None and rel_err(fn(copies(p, family)[0]), want) > TOLERANCE:
                errors.append(f"{family} {kind} {tile}: output differs from the default tile's")
                return None
            ms, _ = timer([lambda t=t: fn(t) for t in copies(p, family)])
        except Exception as exc:  # a tile that fails to compile must not end the run
            errors.append(f"{family} {kind} {tile}: {type(exc).__name__}: {str(exc)[:200]}")
            return None
        finally:
            timer.graphs.clear()
        return ms * 1e3

    with torch.inference_mode():
        for model, dims in models.items():
            for proj, kind, rows, k in launches(*dims):
                print(f"{model} {proj} ({kind}, {rows} x {k}) ...", flush=True)
                p = quant_gemv_gpu.Projection(rows, k, device)
                gen = torch.Generator(device=device).manual_seed(k)
                x = torch.randn(1, k, device=device, generator=gen).to(torch.bfloat16)
                residual = torch.randn(1, k, device=device, generator=gen).to(torch.bfloat16)
                nw = (torch.rand(k, device=device, generator=gen) + 0.5).to(torch.bfloat16)
                acts = (x, residual, nw)
                deadline = time.time() + max(0.0, sweep_end - time.time()) / left
                left -= 1
                row: dict[str, Any] = {"model": model, "proj": proj, "launch": kind,
                                       "N": rows, "K": k}  # fmt: skip
                wants = {}
                # the gated launch has no default wide tile (the row GEMV): time one anyway
                wide_default = wide.wide_tile(device, kind, rows, k) or wide.WideTile(4, 2048)
                for family in ("bf16", "fp8", "awq", "wide"):
                    tile = {"awq": RowsTile(), "wide": wide_default}.get(family)
                    wants[family] = call(family, kind, p, acts, tile)(copies(p, family)[0])
                    want = wants["awq"] if family == "wide" else None  # the same sums
                    row[family] = timed(family, kind, p, acts, tile, want)
                    out_bytes = 2 * (rows // 2 if kind == "gated" else rows)
                    acts_bytes = 2 * k * (3 if kind != "plain" else 1)
                    moved = p.nbytes[FAMILIES[family]] + acts_bytes + out_bytes
                    if row[family]:
                        gbps = moved / (row[family] * 1e-6) / 1e9
                        row[f"{family}%"] = 100 * gbps / args.copy_gbps
                    row[f"{family}_bytes"] = moved
                # the sweeps: AWQ row tiles and FP8 tiles; a norm/gated launch's four FP8
                # tiles first, which a slow AWQ sweep of a large launch left untimed in round 15
                pairs = AWQ_PAIRS[:2] if args.smoke else AWQ_PAIRS
                options = AWQ_OPTIONS[:1] if args.smoke else AWQ_OPTIONS
                fp8_tiles: list[Any] = list(FP8_BLOCK_NS)
                if kind == "plain":
                    fp8_tiles = [(bn, min(bk, triton.next_power_of_2(k)), nw_)
                                 for bn, bk, nw_ in FP8_TILES]  # fmt: skip
                tried: dict[Any, float] = {}
                fp8_tried: dict[Any, float] = {}
                wide_tried: dict[Any, float] = {}
                wide_tiles = WIDE_GATED_TILES if kind == "gated" else WIDE_TILES
                for bn, bk in wide_tiles[:2] if args.smoke else wide_tiles:  # the new kernel first
                    tile = wide.WideTile(bn, min(bk, triton.next_power_of_2(k)))
                    if time.time() < deadline and tile not in wide_tried:
                        wide_tried[tile] = timed("wide", kind, p, acts, tile, wants["awq"]) or 1e9
                for family in ("awq", "fp8") if kind == "plain" else ("fp8", "awq"):
                    if family == "fp8":
                        for tile in fp8_tiles[:2] if args.smoke else fp8_tiles:
                            if time.time() < deadline:
                                us = timed("fp8", kind, p, acts, tile, wants["fp8"])
                                fp8_tried[tile] = us or 1e9
                        continue
                    for bn, bk in pairs:
                        if time.time() < deadline:
                            tile = RowsTile(bn, min(bk, triton.next_power_of_2(k)))
                            tried[tile] = timed("awq", kind, p, acts, tile, wants["awq"]) or 1e9
                    if tried:
                        best = min(tried, key=tried.__getitem__)
                        for nwarps, stages in options:
                            if time.time() < deadline:
                                tile = best._replace(num_warps=nwarps, loop_stages=stages)
                                us = timed("awq", kind, p, acts, tile, wants["awq"])
                                tried[tile] = us or 1e9
                for family, found in (("awq", tried), ("fp8", fp8_tried), ("wide", wide_tried)):
                    sweeps += [{"model": model, "proj": proj, "family": family, "tile": list(t)
                                if isinstance(t, tuple) else t, "us": us}
                               for t, us in found.items()]  # fmt: skip
                    if found:
                        tile = min(found, key=found.__getitem__)
                        if found[tile] < 1e9:
                            row[f"{family}_best"], row[f"{family}_tile"] = found[tile], tile
                results.append(row)
                print("   ", {c: round(row[c], 2) for c in ("bf16", "fp8", "awq", "awq_best",
                                                             "fp8_best", "wide", "wide_best")
                             if row.get(c)},
                      row.get("awq_tile"), row.get("fp8_tile"), row.get("wide_tile"),
                      flush=True)  # fmt: skip
                del p
                if device.type == "cuda":
                    torch.cuda.empty_cache()
    print(f"\n== us per call (CUDA graph, weights from HBM); % of {args.copy_gbps:.0f} GB/s ==")
    cols = ["model", "proj", "launch", "bf16", "bf16%", "fp8", "fp8%", "fp8_best", "fp8_tile",
            "awq", "awq%", "awq_best", "awq_tile", "wide", "wide%", "wide_best",
            "wide_tile"]  # fmt: skip
    print(table(results, cols))
    for model in models:
        mine = [r for r in results if r["model"] == model]
        # a launch whose sweep timed no tile counts at its default tile in the *_best sums
        sums = {c: sum(r.get(c) or r.get(c.removesuffix("_best")) or 0.0 for r in mine)
                for c in ("bf16", "fp8", "fp8_best", "awq", "awq_best", "wide",
                          "wide_best")}  # fmt: skip
        print(f"{model}, one layer's four launches (us): "
              + ", ".join(f"{c} {v:.1f}" for c, v in sums.items()))  # fmt: skip
    for e in errors:
        print("  error:", e)
    device_name = torch.cuda.get_device_name() if device.type == "cuda" else "cpu (smoke)"
    if args.write_tuned and device.type == "cuda":
        write_tuned(Path(args.write_tuned), results, device_name)
    payload = {
        "command": " ".join(sys.argv), "git_commit": git_commit(), "device": device_name,
        "torch": torch.__version__, "triton": triton.__version__,
        "date": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "seconds": time.time() - started,
        "results": results, "sweep": sweeps, "errors": errors,
    }  # fmt: skip
    if args.out:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(json.dumps(payload, indent=1, default=str))
        print(f"wrote {args.out}")
    print(f"done in {time.time() - started:.0f} s; {len(errors)} errors; median default AWQ "
          f"{statistics.median([r['awq'] or 0 for r in results]):.2f} us")  # fmt: skip
    return 0


def write_tuned(folder: Path, results: list[dict[str, Any]], device_name: str) -> None:
    """The AWQ plugin's table for this GPU: the tree's rows, plus each launch's best row
    tile where it beat the default by ``TUNED_MIN_GAIN``."""
    from engine_awq.tiled import pick_chunk
    from engine_sdk.layers.split_k import tuned_file_name

    name = tuned_file_name(device_name)
    tree = REPO / "plugins/awq/engine_awq/tuned" / name
    payload = json.loads(tree.read_text()) if tree.is_file() else {"configs": {}}
    configs = payload["configs"]
    for r in results:
        tile, best, default = r.get("awq_tile"), r.get("awq_best"), r.get("awq")
        if tile is None or default is None or best > default * (1 - TUNED_MIN_GAIN):
            continue
        key = f"awq_rows_{r['launch']}_c{pick_chunk(r['K'], GROUP)},{r['N']},{r['K']},1"
        configs[key] = {**tile._asdict(), "ms": round(best / 1e3, 5),
                        "default_ms": round(default / 1e3, 5)}  # fmt: skip
    for r in results:  # engine_awq.wide's tiles, against its default tile; a gated launch
        # takes it only by a row here, written where it beats the row GEMV's best
        tile, best, default = r.get("wide_tile"), r.get("wide_best"), r.get("wide")
        if r["launch"] == "gated":
            default = r.get("awq_best") or r.get("awq")
        if tile is None or default is None or best > default * (1 - TUNED_MIN_GAIN):
            continue
        key = f"awq_wide_{r['launch']}_c{pick_chunk(r['K'], GROUP)},{r['N']},{r['K']},1"
        configs[key] = {**tile._asdict(), "ms": round(best / 1e3, 5),
                        "default_ms": round(default / 1e3, 5)}  # fmt: skip
    payload.update(device=device_name, rows_written_by=" ".join(sys.argv),
                   rows_git_commit=git_commit(), rows_date=time.strftime("%Y-%m-%d"))  # fmt: skip
    out = folder / "engine_awq" / name
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(payload, indent=1) + "\n")
    print(f"wrote {out}")


if __name__ == "__main__":
    sys.exit(main())
