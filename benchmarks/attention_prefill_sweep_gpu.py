"""Engine's Triton paged attention at prefill: tile sweep, before/after, and torch's flash.

Run on the GPU machine (Engine's packages on the path)::

    python3 benchmarks/attention_prefill_sweep_gpu.py --old-kernels .gpu/triton_old_kernels.py \\
        --out $OUT/attention_prefill.json

For each case of ``attention_fa3_gpu.CASES`` plus W1-like prefill (16 x 512): the time of
this tree's kernel and, with ``--old-kernels`` (a copy of an earlier ``kernels.py``), of
that kernel with the same tiles, and the largest difference of their outputs. For the
prefill cases it times the query blocks launched in sequence order (``HEAVY_FIRST`` off)
and then every ``PREFILL_TILES`` candidate (least BLOCK_M, BLOCK_N,
warps, stages) and, where the lengths are equal and nothing is cached, torch's
``scaled_dot_product_attention`` on contiguous tensors (the flash kernel torch ships) as a
reference point. Each call is timed inside a CUDA graph (``quant_gemv_gpu.Timer``).
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

import torch

# the backend launches an earlier kernels.py's kernel too, which may take no PDL argument
os.environ.setdefault("ENGINE_PDL", "0")

sys.path.insert(0, str(Path(__file__).parent))
from attention_fa3_gpu import BLOCK, CASES, DTYPE, HEAD_DIM, HEADS, KV_HEADS, build  # noqa: E402
from quant_gemv_gpu import Timer  # noqa: E402

EXTRA_CASES = [("prefill 16 x 512 (W1-like)", [(512, 0)] * 16)]
CANDIDATES = [
    (m, n, w, s)
    for m in (64, 128)
    for n in (32, 64, 128)
    for w in (4, 8)
    for s in (2, 3, 4)
    if not (m == 128 and n == 128 and s == 4)  # beyond the shared memory
]


def load_old(path: Path) -> Any:
    spec = importlib.util.spec_from_file_location("old_triton_kernels", path)
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def time_backend(backend: Any, t: dict[str, Any], timer: Timer) -> tuple[float, torch.Tensor]:
    meta = backend.build_metadata(t["batch"])
    ms, outs = timer([lambda: backend.forward(t["q"], t["kv"], t["kv"], t["cache"], meta)])
    return ms * 1e3, outs[-1]


def sdpa_us(seqs: list[tuple[int, int]], t: dict[str, Any], timer: Timer) -> float | None:
    """torch's flash attention on the same q and a contiguous copy of the keys and values."""
    new = {n for n, _ in seqs}
    if len(new) != 1 or any(c for _, c in seqs):
        return None
    (length,) = new
    b = t["batch"]
    q = t["q"].view(len(seqs), length, HEADS, HEAD_DIM).transpose(1, 2).contiguous()
    cache = t["cache"]  # [2, blocks, BLOCK, KV_HEADS, HEAD_DIM]
    table = b.block_tables.long()
    group = HEADS // KV_HEADS  # expanded to every query head: the flash kernel's layout
    k = cache[0][table].flatten(1, 2)[:, :length].transpose(1, 2).repeat_interleave(group, 1)
    v = cache[1][table].flatten(1, 2)[:, :length].transpose(1, 2).repeat_interleave(group, 1)
    f = torch.nn.functional.scaled_dot_product_attention
    try:
        ms, _ = timer([lambda: f(q, k.contiguous(), v.contiguous(), is_causal=True)])
    except Exception as exc:
        print(f"sdpa failed: {type(exc).__name__}: {exc}"[:200], flush=True)
        return None
    return ms * 1e3


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--old-kernels", type=Path)
    parser.add_argument("--out", type=Path)
    parser.add_argument("--smoke", action="store_true", help="tiny cases on the CPU interpreter")
    args = parser.parse_args()
    from engine_sdk.testing.triton_interpreter import enable

    enable()  # the interpreter, with the SDK's fixes, when there is no GPU (--smoke)
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    cases = CASES + EXTRA_CASES
    if args.smoke:
        cases = [("decode b2", [(1, 40), (1, 70)]), ("prefill 2 x 48", [(48, 0)] * 2)]
        CANDIDATES[:] = CANDIDATES[:2]
    import engine_triton.backend as backend_mod
    from engine_sdk.interfaces.attention import AttentionLayerConfig

    new_kernel = backend_mod.paged_attention_kernel
    old = load_old(args.old_kernels) if args.old_kernels else None
    default_tiles = backend_mod.PREFILL_TILES
    backend = backend_mod.TritonAttentionBackend(
        AttentionLayerConfig(HEADS, KV_HEADS, HEAD_DIM, HEAD_DIM**-0.5, BLOCK, DTYPE)
    )
    timer = Timer(device)
    name = torch.cuda.get_device_name() if device.type == "cuda" else "cpu (smoke)"
    record: dict[str, Any] = {"device": name, "rows": [], "sweep": []}
    record["date"] = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    record["default_tiles"] = list(default_tiles)
    print(record["device"], "default prefill tiles", default_tiles, flush=True)
    print(f"{'case':28s} {'new us':>8s} {'old us':>8s} {'old/new':>8s} {'|diff|':>8s} "
          f"{'sdpa us':>8s} {'in order':>8s}", flush=True)  # fmt: skip
    with torch.inference_mode():
        for name, seqs in cases:
            t = build(seqs, device)
            backend_mod.paged_attention_kernel = new_kernel
            new_us, new_out = time_backend(backend, t, timer)
            row: dict[str, Any] = {"case": name, "new_us": new_us}
            if old is not None:
                backend_mod.paged_attention_kernel = old.paged_attention_kernel
                row["old_us"], old_out = time_backend(backend, t, timer)
                row["max_abs_diff"] = float((old_out.float() - new_out.float()).abs().max())
                backend_mod.paged_attention_kernel = new_kernel
            prefill = not t["batch"].is_decode_only
            if prefill:
                row["sdpa_us"] = sdpa_us(seqs, t, timer)
                backend_mod.HEAVY_FIRST = False  # the query blocks in sequence order
                row["in_order_us"], _ = time_backend(backend, t, timer)
                backend_mod.HEAVY_FIRST = True
            record["rows"].append(row)
            old_us = row.get("old_us", float("nan"))
            print(f"{name:28s} {new_us:8.1f} {old_us:8.1f} {old_us / new_us:8.2f} "
                  f"{row.get('max_abs_diff', float('nan')):8.4f} "
                  f"{row.get('sdpa_us') or float('nan'):8.1f} "
                  f"{row.get('in_order_us', float('nan')):8.1f}", flush=True)  # fmt: skip
            if prefill:
                for tiles in CANDIDATES:
                    backend_mod.PREFILL_TILES = tiles
                    entry: dict[str, Any] = {"case": name, "tiles": list(tiles)}
                    try:
                        entry["us"], out = time_backend(backend, t, timer)
                        entry["max_abs_diff"] = float((out.float() - new_out.float()).abs().max())
                    except Exception as exc:
                        entry["error"] = f"{type(exc).__name__}: {exc}"[:200]
                    record["sweep"].append(entry)
                    timer.graphs.clear()
                backend_mod.PREFILL_TILES = default_tiles
                done = [e for e in record["sweep"] if e["case"] == name and "us" in e]
                for e in sorted(done, key=lambda e: e["us"])[:5]:
                    print(f"    tiles {e['tiles']}: {e['us']:.1f} us (|diff| "
                          f"{e['max_abs_diff']:.4f})", flush=True)  # fmt: skip
            timer.graphs.clear()
            if args.out:
                args.out.write_text(json.dumps(record, indent=1))


if __name__ == "__main__":
    main()
