"""Batch-1 decode (W2: 128 in, 256 out) of bf16, FP8 and AWQ through ``engine bench``,
with the quantized split-K GEMVs on and off, all in one run on the GPU machine.

Run from the repository root with Engine importable (installed or on ``PYTHONPATH``)::

    python3 benchmarks/quant_decode_gpu.py --model .gpu/qwen3 --out $OUT/quant_decode.json
    python3 benchmarks/quant_decode_gpu.py --model .gpu/qwen3 --shapes llama8b --out ...

``--model`` is a Qwen3-0.6B-shaped folder (config and tokenizer; weights are dummy); the
Llama-3.1-8B shape reuses its tokenizer. Online FP8 comes from ``--quantization fp8``, AWQ
from a copy of the folder whose config declares AutoAWQ 4-bit (group 128). ``fp8_rows``:
the SDK's row GEMV with the fp8 weight at one row (the default: 4 weight rows a program, 2
gate rows in the gated launch; ``fp8_rows4`` 4 rows in the plain and norm launches and 1 in
the gated one, as round 15 measured it; ``fp8_rows2`` round 14's 2 and 1), ``fp8_gemv``:
the plugin's split-K GEMV (``ENGINE_FP8_ROW_GEMV=0``), ``awq_rows``: the AWQ row GEMV at
one token (:mod:`engine_awq.rows`, the default, with the GPU's measured tiles where its
table has them, and :mod:`engine_awq.wide` for rows of 4096 or more; the norm and SiLU left
to the decoder's kernels on rows longer than 2048; ``awq_fused`` them fused on every row,
as in round 16's first calls; ``awq_narrow`` the row GEMV on every launch, as before round
16; ``awq_rows_default`` the built-in tile on every launch, ``awq_rows8`` eight columns a
program over 1024 activations a step, ``awq_rows_k4096`` 4096 activations a step),
``*_unfused``: the decoder's add+RMSNorm and SiLU-and-mul kernels as their own launches
(``ENGINE_FUSED_NORM=0``), ``*_pdl`` / ``*_nopdl``: with and without programmatic dependent
launch (``ENGINE_PDL=1`` / ``0``, :mod:`engine_sdk.layers.pdl`), ``*_nopf``: PDL without the
GEMVs' L2 prefetch (``ENGINE_PDL_PREFETCH=0``), ``bf16_compile``: torch.compile's forward
in the decode graph (``ENGINE_TORCH_COMPILE=1``, one captured size) against ``bf16_seqs1``
(the same size, eager forward), ``*_stages2``: the row GEMVs' K loops pipelined
(``ENGINE_GEMV_LOOP_STAGES`` / ``ENGINE_AWQ_LOOP_STAGES`` 2; AWQ with the row GEMV on every
launch, to set against ``awq_narrow``), ``awq_gemv``: its split-K GEMV
(``ENGINE_AWQ_ROW_GEMV=0``), ``old`` rows ``ENGINE_QUANT_GEMV=0``. The table gives ms per
output token and the ratio to bf16 of the same shape (< 1: faster than bf16).
"""

from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path
from typing import Any

from side_by_side import W2, engine, llama_dir
from suite_extra import awq_variant

# label -> (model kind, extra flags, environment: a value None removes the variable)
VARIANTS: list[tuple[str, str, list[str], dict[str, str | None]]] = [
    ("bf16", "base", [], {"ENGINE_QUANT_GEMV": None}),
    ("fp8_rows", "base", ["--quantization", "fp8"], {"ENGINE_QUANT_GEMV": "1"}),
    (  # round 15's W2 run (call 3): 4 rows in the plain and norm launches, 1 gated
        "fp8_rows4",
        "base",
        ["--quantization", "fp8"],
        {
            "ENGINE_QUANT_GEMV": "1",
            "ENGINE_GEMV_FP8_BLOCK_N": "4",
            "ENGINE_GEMV_FP8_GATED_BLOCK_N": "1",
        },
    ),
    (  # round 14's tiles: bf16's rows a program (2 plain and norm, 1 gated)
        "fp8_rows2",
        "base",
        ["--quantization", "fp8"],
        {
            "ENGINE_QUANT_GEMV": "1",
            "ENGINE_GEMV_FP8_BLOCK_N": "2",
            "ENGINE_GEMV_FP8_GATED_BLOCK_N": "1",
        },
    ),
    (
        "fp8_gemv",
        "base",
        ["--quantization", "fp8"],
        {"ENGINE_QUANT_GEMV": "1", "ENGINE_FP8_ROW_GEMV": "0"},
    ),
    (
        "fp8_old",
        "base",
        ["--quantization", "fp8"],
        {"ENGINE_QUANT_GEMV": "0", "ENGINE_FP8_ROW_GEMV": "0"},
    ),
    ("awq_rows", "awq", [], {"ENGINE_QUANT_GEMV": "1"}),
    # round 16's calls 1-2: the norm and SiLU fused into the one-token GEMVs on every row
    ("awq_fused", "awq", [], {"ENGINE_QUANT_GEMV": "1", "ENGINE_AWQ_FUSE_NORM_MAX_K": "65536"}),
    # round 15's default: the row GEMV on every launch, engine_awq.wide off
    ("awq_narrow", "awq", [], {"ENGINE_QUANT_GEMV": "1", "ENGINE_AWQ_WIDE_MIN_K": "0"}),
    # the built-in tile on every launch: the sweep switch makes rows_tile skip the GPU's table
    ("awq_rows_default", "awq", [], {"ENGINE_QUANT_GEMV": "1", "ENGINE_AWQ_ROWS_BLOCK_N": "4"}),
    (
        "awq_rows8",
        "awq",
        [],
        {
            "ENGINE_QUANT_GEMV": "1",
            "ENGINE_AWQ_ROWS_BLOCK_N": "8",
            "ENGINE_AWQ_ROWS_BLOCK_K": "1024",
        },
    ),
    ("awq_rows_k4096", "awq", [], {"ENGINE_QUANT_GEMV": "1", "ENGINE_AWQ_ROWS_BLOCK_K": "4096"}),
    # the decoder's add+RMSNorm (and SiLU-and-mul) kernels as their own launches, the
    # projections' GEMVs plain: no per-program norm prologue, no per-weight normalization
    ("awq_unfused", "awq", [], {"ENGINE_QUANT_GEMV": "1", "ENGINE_FUSED_NORM": "0"}),
    (
        "fp8_unfused",
        "base",
        ["--quantization", "fp8"],
        {"ENGINE_QUANT_GEMV": "1", "ENGINE_FUSED_NORM": "0"},
    ),
    ("bf16_unfused", "base", [], {"ENGINE_QUANT_GEMV": None, "ENGINE_FUSED_NORM": "0"}),
    # programmatic dependent launch (engine_sdk.layers.pdl) on and off, whatever the
    # default: *_pdl with the GEMVs' L2 prefetch, *_nopf without it
    ("bf16_pdl", "base", [], {"ENGINE_QUANT_GEMV": None, "ENGINE_PDL": "1"}),
    ("fp8_pdl", "base", ["--quantization", "fp8"], {"ENGINE_QUANT_GEMV": "1", "ENGINE_PDL": "1"}),
    ("awq_pdl", "awq", [], {"ENGINE_QUANT_GEMV": "1", "ENGINE_PDL": "1"}),
    ("bf16_nopdl", "base", [], {"ENGINE_QUANT_GEMV": None, "ENGINE_PDL": "0"}),
    ("fp8_nopdl", "base", ["--quantization", "fp8"], {"ENGINE_QUANT_GEMV": "1", "ENGINE_PDL": "0"}),
    ("awq_nopdl", "awq", [], {"ENGINE_QUANT_GEMV": "1", "ENGINE_PDL": "0"}),
    (
        "bf16_nopf",
        "base",
        [],
        {"ENGINE_QUANT_GEMV": None, "ENGINE_PDL": "1", "ENGINE_PDL_PREFETCH": "0"},
    ),
    (
        "awq_nopf",
        "awq",
        [],
        {"ENGINE_QUANT_GEMV": "1", "ENGINE_PDL": "1", "ENGINE_PDL_PREFETCH": "0"},
    ),
    # issue 14 item 2, never measured: torch.compile's forward in the decode graphs (one
    # compile per captured size, so only size 1), against bf16_seqs1 with the same sizes
    (
        "bf16_compile",
        "base",
        ["--max-num-seqs", "1"],
        {"ENGINE_QUANT_GEMV": None, "ENGINE_PDL": "0", "ENGINE_TORCH_COMPILE": "1"},
    ),
    ("bf16_seqs1", "base", ["--max-num-seqs", "1"], {"ENGINE_QUANT_GEMV": None, "ENGINE_PDL": "0"}),
    # the row GEMVs' K loops pipelined (cp.async, 2 stages), PDL off: against *_nopdl, and
    # for AWQ against awq_narrow (the row GEMV on every launch; the wide GEMV has no STAGES)
    (
        "bf16_stages2",
        "base",
        [],
        {"ENGINE_QUANT_GEMV": None, "ENGINE_PDL": "0", "ENGINE_GEMV_LOOP_STAGES": "2"},
    ),
    (
        "fp8_stages2",
        "base",
        ["--quantization", "fp8"],
        {"ENGINE_QUANT_GEMV": "1", "ENGINE_PDL": "0", "ENGINE_GEMV_LOOP_STAGES": "2"},
    ),
    (
        "awq_rows_stages2",
        "awq",
        [],
        {
            "ENGINE_QUANT_GEMV": "1",
            "ENGINE_PDL": "0",
            "ENGINE_AWQ_WIDE_MIN_K": "0",
            "ENGINE_AWQ_LOOP_STAGES": "2",
        },
    ),
    ("awq_gemv", "awq", [], {"ENGINE_QUANT_GEMV": "1", "ENGINE_AWQ_ROW_GEMV": "0"}),
    ("awq_old", "awq", [], {"ENGINE_QUANT_GEMV": "0"}),
]
_ENV_NAMES = {name for *_, env in VARIANTS for name in env}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", type=Path, required=True, help="Qwen3-0.6B-shaped folder")
    parser.add_argument("--shapes", default="qwen06b,llama8b")
    parser.add_argument("--variants", help="labels to run, comma-separated (default: all)")
    parser.add_argument("--iters", default="3")
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    work = Path("/tmp/quant_decode")
    work.mkdir(exist_ok=True)
    wanted = set(args.variants.split(",")) if args.variants else None
    table: dict[str, Any] = {"date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())}
    table["commit"] = os.environ.get("ENGINE_COMMIT", "")
    for shape in args.shapes.split(","):
        base = args.model if shape == "qwen06b" else llama_dir(work, args.model)
        models = {"base": base, "awq": awq_variant(base)}
        for label, kind, flags, env in VARIANTS:
            if wanted and label not in wanted:
                continue
            for var in _ENV_NAMES:
                os.environ.pop(var, None)
            os.environ.update({k: v for k, v in env.items() if v is not None})
            bench_args = [*flags, *W2, "--num-iters", args.iters, "--num-iters-warmup", "1"]
            name = f"{shape}_{label}"
            record = engine(work, name, "latency", models[kind], bench_args, False)
            table[name] = {"env": env, **(record or {"failed": True})}
            args.out.write_text(json.dumps(table, indent=1))
    print(f"\n{'run':22s} {'ms/token':>9s} {'vs bf16':>8s}")
    for shape in args.shapes.split(","):
        ref = (table.get(f"{shape}_bf16") or {}).get("ms_per_output_token")
        for label, *_ in VARIANTS:
            ms = (table.get(f"{shape}_{label}") or {}).get("ms_per_output_token")
            if ms is None:
                continue
            ratio = f"{ms / ref:.2f}" if ref else "-"
            print(f"{shape + '_' + label:22s} {ms:9.3f} {ratio:>8s}")


if __name__ == "__main__":
    main()
