"""Batch-1 decode kernels on the GPU: the Triton GEMV against cuBLAS (``F.linear``) on the
Qwen3-0.6B and Llama-3.1-8B projections, and split-KV decode attention against one program
per (sequence, KV head).

    python3 benchmarks/decode_kernels_gpu.py --out decode_kernels.json [--sweep]

Every kernel is timed inside a CUDA graph of ``--reps`` calls (launch cost as in the
engine's decode graph), rotating over enough weight copies that the L2 cache (50 MB on
an H200) cannot hold them, so each call reads its weight from HBM as a layer of a real
model does. Results are checked against float32 references. ``--sweep`` also times every
tile choice of the GEMV and prints the best per shape. ``--parts fused`` times the fused
decode GEMV ``gemv_add_rms_norm`` (residual add and RMSNorm in the q/k/v and gate/up
GEMVs) against ``add_rms_norm`` + ``gemv``, at one row.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path
from typing import Any

import torch

SHAPES = {  # name: (N, K)
    "0.6b.qkv": (4096, 1024),
    "0.6b.o": (1024, 2048),
    "0.6b.gate_up": (6144, 1024),
    "0.6b.down": (1024, 3072),
    "8b.qkv": (6144, 4096),
    "8b.o": (4096, 4096),
    "8b.gate_up": (28672, 4096),
    "8b.down": (4096, 14336),
}
COPY_BW = 4.1e12  # measured copy bandwidth of the machine (bytes/s)


def graph_time_us(fn: Any, calls: int, reps: int) -> float:
    """Mean device time of one ``fn(i)`` call, ``i`` rotating over ``calls`` inputs."""
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        for i in range(calls):
            fn(i)  # warm up / compile
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for r in range(reps):
            fn(r % calls)
    graph.replay()
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    best = float("inf")
    for _ in range(5):
        start.record()
        graph.replay()
        end.record()
        torch.cuda.synchronize()
        best = min(best, start.elapsed_time(end) * 1000 / reps)
    return best


def bench_gemv(rows_list: list[int], reps: int, sweep: bool) -> list[dict[str, Any]]:
    from engine_sdk.layers import gemv

    out = []
    for name, (n, k) in SHAPES.items():
        nbytes = n * k * 2
        copies = max(2, -(-200 * 2**20 // nbytes))
        weights = [torch.randn(n, k, device="cuda", dtype=torch.bfloat16) for _ in range(copies)]
        for rows in rows_list:
            x = torch.randn(rows, k, device="cuda", dtype=torch.bfloat16)
            ref = x.float() @ weights[0].float().T
            err = (gemv.gemv(x, weights[0]).float() - ref).abs().max().item()
            lib = graph_time_us(
                lambda i, x=x, w=weights: torch.nn.functional.linear(x, w[i]), copies, reps
            )
            tri = graph_time_us(lambda i, x=x, w=weights: gemv.gemv(x, w[i]), copies, reps)
            row: dict[str, Any] = {
                "shape": name, "n": n, "k": k, "rows": rows, "weight_mb": nbytes / 1e6,
                "cublas_us": lib, "gemv_us": tri, "roofline_us": nbytes / COPY_BW * 1e6,
                "gemv_tiles": list(gemv.pick_tiles(n, k)), "max_err": err,
                "ref_max": ref.abs().max().item(),
            }  # fmt: skip
            if sweep and rows in (1, 4):
                tried = {}
                for bn in (1, 2, 4, 8, 16):
                    for bk in (256, 512, 1024, 2048):
                        for warps in (4, 8):
                            tiles = (bn, min(bk, 1 << (k - 1).bit_length()), warps)
                            if tiles in tried:
                                continue
                            tried[tiles] = graph_time_us(
                                lambda i, t=tiles, x=x, w=weights: gemv.gemv(x, w[i], None, t),
                                copies,
                                reps,
                            )
                best = min(tried, key=tried.__getitem__)
                row["best_tiles"], row["best_us"] = list(best), tried[best]
            print(
                f"{name:13s} M={rows} cublas {lib:7.2f} us  gemv {tri:7.2f} us  roofline "
                f"{row['roofline_us']:6.2f} us  err {err:.3g}"
                + (
                    f"  best {row['best_tiles']} {row['best_us']:.2f} us"
                    if "best_us" in row
                    else ""
                ),
                flush=True,
            )
            out.append(row)
    return out


def bench_attention(reps: int) -> list[dict[str, Any]]:
    from engine_sdk.interfaces.attention import AttentionBatch, AttentionLayerConfig
    from engine_triton import backend as tb

    out = []
    heads, kv_heads, dim, block = 16, 8, 128, 16
    for batch_size in (1, 4, 16):
        for ctx in (128, 512, 2048):
            cfg = AttentionLayerConfig(heads, kv_heads, dim, dim**-0.5, block, torch.bfloat16)
            backend = tb.TritonAttentionBackend(cfg)
            blocks_per_seq = -(-(ctx + 1) // block)
            num_blocks = batch_size * blocks_per_seq + 1
            caches = [
                torch.randn(backend.kv_cache_shape(num_blocks, block, kv_heads, dim),
                            device="cuda", dtype=torch.bfloat16)
                for _ in range(4)
            ]  # fmt: skip
            tables = torch.arange(1, num_blocks, device="cuda", dtype=torch.int32)
            tables = tables.view(batch_size, blocks_per_seq)
            seq_lens = [ctx + 1] * batch_size
            slots = (tables[:, ctx // block] * block + ctx % block).to(torch.int64)
            batch = AttentionBatch(
                query_start_loc=torch.arange(batch_size + 1, device="cuda", dtype=torch.int32),
                seq_lens=torch.tensor(seq_lens, device="cuda", dtype=torch.int32),
                block_tables=tables, slot_mapping=slots, max_query_len=1,
                max_seq_len=ctx + 1, num_seqs=batch_size, num_tokens=batch_size,
                query_start_loc_cpu=list(range(batch_size + 1)), seq_lens_cpu=seq_lens,
            )  # fmt: skip
            q = torch.randn(batch_size, heads, dim, device="cuda", dtype=torch.bfloat16)
            k = torch.randn(batch_size, kv_heads, dim, device="cuda", dtype=torch.bfloat16)
            v = torch.randn_like(k)
            result: dict[str, Any] = {"batch": batch_size, "ctx": ctx}
            outs = {}
            for label, max_splits in (("one_program", 1), ("split", tb.MAX_KV_SPLITS)):
                saved = tb.MAX_KV_SPLITS
                tb.MAX_KV_SPLITS = max_splits
                meta = backend.build_metadata(batch)
                tb.MAX_KV_SPLITS = saved
                outs[label] = backend.forward(q, k, v, caches[0], meta).float()
                result[f"{label}_us"] = graph_time_us(
                    lambda i, m=meta, b=backend, c=caches, qkv=(q, k, v): b.forward(*qkv, c[i], m),
                    len(caches),
                    reps,
                )
                result[f"{label}_splits"] = meta.kv_splits
            result["max_diff"] = (outs["split"] - outs["one_program"]).abs().max().item()
            print(
                f"attention batch {batch_size:2d} ctx {ctx:5d}: one program "
                f"{result['one_program_us']:6.2f} us, split x{result['split_splits']} "
                f"{result['split_us']:6.2f} us, max diff {result['max_diff']:.3g}",
                flush=True,
            )
            out.append(result)
    return out


FUSED = {  # name: (N, K)
    "0.6b.qkv+norm": (4096, 1024),
    "0.6b.gate_up+norm": (6144, 1024),
    "8b.qkv+norm": (6144, 4096),
    "8b.gate_up+norm": (28672, 4096),
}


def _fused_pair(k: int, weights: list[torch.Tensor]) -> tuple[Any, Any]:
    """(the two kernels, the fused one) as functions of the weight copy's index."""
    from engine_sdk.layers import fused_ops, gemv

    x = torch.randn(1, k, device="cuda", dtype=torch.bfloat16)
    res = torch.randn(1, k, device="cuda", dtype=torch.bfloat16)
    nw = torch.rand(k, device="cuda", dtype=torch.bfloat16) + 0.5
    return (
        lambda i: gemv.gemv(fused_ops.add_rms_norm(x, res, nw, 1e-6)[0], weights[i]),
        lambda i: gemv.gemv_add_rms_norm(x, res, nw, 1e-6, weights[i])[0],
    )


def bench_fused(reps: int) -> list[dict[str, Any]]:
    out = []
    for name, (n, k) in FUSED.items():
        copies = max(2, -(-200 * 2**20 // (n * k * 2)))
        weights = [torch.randn(n, k, device="cuda", dtype=torch.bfloat16) for _ in range(copies)]
        two, one = _fused_pair(k, weights)
        diff = (one(0).float() - two(0).float()).abs().max().item()
        t_two, t_one = graph_time_us(two, copies, reps), graph_time_us(one, copies, reps)
        row = {"shape": name, "n": n, "k": k, "two_kernels_us": t_two, "fused_us": t_one,
               "max_diff": diff}  # fmt: skip
        print(f"{name:18s} two kernels {t_two:7.2f} us  fused {t_one:7.2f} us  diff {diff:.3g}",
              flush=True)  # fmt: skip
        out.append(row)
    return out


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--rows", default="1,2,4")
    parser.add_argument("--reps", type=int, default=200)
    parser.add_argument("--sweep", action="store_true")
    parser.add_argument("--parts", default="gemv,attention", help="gemv, attention, fused")
    args = parser.parse_args()
    parts = args.parts.split(",")
    torch.manual_seed(0)
    report = {
        "device": torch.cuda.get_device_name(),
        "date": time.strftime("%Y-%m-%d"),
        "command": "python3 benchmarks/decode_kernels_gpu.py " + ("--sweep" if args.sweep else ""),
    }
    if "gemv" in parts:
        report["gemv"] = bench_gemv([int(r) for r in args.rows.split(",")], args.reps, args.sweep)
    if "attention" in parts:
        report["attention"] = bench_attention(args.reps)
    if "fused" in parts:
        report["fused"] = bench_fused(args.reps)
    args.out.write_text(json.dumps(report, indent=1))


if __name__ == "__main__":
    main()
