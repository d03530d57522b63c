"""Engine's Triton paged attention against FlashAttention 3 (the kernel vLLM runs on
Hopper, from the vLLM anchor's ``vllm.vllm_flash_attn``) on the same KV cache, one GPU.

Run on the GPU machine after the vLLM anchor is unpacked, with both on the path::

    PYTHONPATH=/tmp/site2:/tmp/site:$HOME/v/site python3 benchmarks/attention_fa3_gpu.py \\
        --out $OUT/attention_fa3.json

Qwen3-0.6B's attention (16 query heads, 8 KV heads, head_dim 128, bf16) on one paged cache
(``[2, blocks, 16, 8, 128]``, the layout both kernels read, blocks shuffled): decode batches
of 1 to 256 sequences whose contexts are W4-like (uniform in 100..2048) or fixed, and
prefill steps (whole prompts, and new tokens after a cached prefix). Each call is timed
inside a CUDA graph (``quant_gemv_gpu.Timer``); Engine's call includes its K/V store
kernel (writing nothing here: slot -1), FA3's is attention alone. Outputs are compared
(max abs difference) and the decode rows give the KV bytes read per second. Without
vLLM importable only Engine's column is filled.
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import time
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).parent))
from quant_gemv_gpu import Timer  # noqa: E402

HEADS, KV_HEADS, HEAD_DIM, BLOCK = 16, 8, 128, 16
DTYPE = torch.bfloat16
# (name, [(new tokens, cached tokens before them)] per sequence)
rng = random.Random(0)
CASES: list[tuple[str, list[tuple[int, int]]]] = [
    ("decode b1 ctx 1024", [(1, 1023)]),
    ("decode b16 ctx 1024", [(1, 1023)] * 16),
    ("decode b64 w4-like", [(1, rng.randint(100, 2048)) for _ in range(64)]),
    ("decode b256 w4-like", [(1, rng.randint(100, 2048)) for _ in range(256)]),
    ("decode b256 ctx 512", [(1, 511)] * 256),
    ("prefill 8 x 1024", [(1024, 0)] * 8),
    ("chunk 4 x 512 after 1536", [(512, 1536)] * 4),
]


def build(seqs: list[tuple[int, int]], device: torch.device) -> dict[str, Any]:
    """One step's tensors: q, the cache, block tables, lengths (both kernels' inputs)."""
    from engine_sdk.interfaces.attention import AttentionBatch

    lengths = [new + cached for new, cached in seqs]
    per_seq = [-(-n // BLOCK) for n in lengths]
    num_blocks = sum(per_seq) + 1
    order = torch.randperm(num_blocks - 1, generator=torch.Generator().manual_seed(1)) + 1
    tables, at = [], 0
    for n in per_seq:
        tables.append(order[at : at + n].tolist())
        at += n
    width = max(per_seq)
    table = torch.tensor([t + [0] * (width - len(t)) for t in tables], dtype=torch.int32)
    starts = [0]
    for new, _ in seqs:
        starts.append(starts[-1] + new)
    num_tokens = starts[-1]
    gen = torch.Generator(device=device).manual_seed(2)
    cache = torch.randn(2, num_blocks, BLOCK, KV_HEADS, HEAD_DIM, generator=gen, device=device)
    q = torch.randn(num_tokens, HEADS, HEAD_DIM, generator=gen, device=device)
    kv = torch.zeros(num_tokens, KV_HEADS, HEAD_DIM, device=device, dtype=DTYPE)
    batch = AttentionBatch(
        query_start_loc=torch.tensor(starts, dtype=torch.int32, device=device),
        seq_lens=torch.tensor(lengths, dtype=torch.int32, device=device),
        block_tables=table.to(device),
        slot_mapping=torch.full((num_tokens,), -1, dtype=torch.int64, device=device),
        max_query_len=max(new for new, _ in seqs),
        max_seq_len=max(lengths),
        num_seqs=len(seqs),
        num_tokens=num_tokens,
        query_start_loc_cpu=starts,
        seq_lens_cpu=lengths,
    )
    kv_bytes = sum(lengths) * KV_HEADS * HEAD_DIM * 2 * 2
    return {"q": q.to(DTYPE), "kv": kv, "cache": cache.to(DTYPE), "batch": batch,
            "kv_bytes": kv_bytes}  # fmt: skip


def measure(name: str, seqs: list[tuple[int, int]], backend: Any, fa: Any, timer: Timer,
            scale: float) -> dict[str, Any]:  # fmt: skip
    """One case: Engine's time and bandwidth; FA3's time and the outputs' difference."""
    t = build(seqs, torch.device("cuda"))
    b = t["batch"]
    meta = backend.build_metadata(b)
    ms, outs = timer([lambda: backend.forward(t["q"], t["kv"], t["kv"], t["cache"], meta)])
    ours = outs[-1].view(-1, HEADS, HEAD_DIM)
    row: dict[str, Any] = {"case": name, "engine_us": ms * 1e3}
    row["engine_gb_s"] = t["kv_bytes"] / (ms * 1e-3) / 1e9
    if fa is None:
        return row

    def fa3() -> torch.Tensor:
        return fa(
            t["q"], t["cache"][0], t["cache"][1], max_seqlen_q=b.max_query_len,
            cu_seqlens_q=b.query_start_loc, max_seqlen_k=b.max_seq_len, seqused_k=b.seq_lens,
            softmax_scale=scale, causal=True, block_table=b.block_tables, fa_version=3,
        )  # fmt: skip

    try:
        fa_ms, fa_outs = timer([fa3])
        row["fa3_us"] = fa_ms * 1e3
        row["max_abs_diff"] = float((fa_outs[-1].float() - ours.float()).abs().max())
    except Exception as exc:
        row["fa3_error"] = f"{type(exc).__name__}: {exc}"[:300]
    return row


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    from engine_sdk.interfaces.attention import AttentionLayerConfig
    from engine_triton.backend import TritonAttentionBackend

    try:
        from vllm.vllm_flash_attn import flash_attn_varlen_func as fa
    except Exception as exc:  # the anchor not unpacked, or not on the path
        print(f"FA3 unavailable ({type(exc).__name__}: {exc}); Engine only", flush=True)
        fa = None
    scale = HEAD_DIM**-0.5
    backend = TritonAttentionBackend(
        AttentionLayerConfig(HEADS, KV_HEADS, HEAD_DIM, scale, BLOCK, DTYPE)
    )
    timer, rows = Timer(torch.device("cuda")), []
    record: dict[str, Any] = {"device": torch.cuda.get_device_name(), "rows": rows}
    record["date"] = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    print(record["device"])
    print(f"{'case':26s} {'engine us':>10s} {'fa3 us':>9s} {'fa3/engine':>10s} "
          f"{'engine GB/s':>11s} {'max |diff|':>10s}", flush=True)  # fmt: skip
    with torch.inference_mode():
        for name, seqs in CASES:
            row = measure(name, seqs, backend, fa, timer, scale)
            timer.graphs.clear()
            rows.append(row)
            fa_us, diff = row.get("fa3_us", float("nan")), row.get("max_abs_diff", float("nan"))
            print(f"{name:26s} {row['engine_us']:10.1f} {fa_us:9.1f} "
                  f"{fa_us / row['engine_us']:10.2f} {row['engine_gb_s']:11.0f} {diff:10.4f} "
                  f"{row.get('fa3_error', '')}", flush=True)  # fmt: skip
            if args.out:
                args.out.write_text(json.dumps(record, indent=1))


if __name__ == "__main__":
    main()
