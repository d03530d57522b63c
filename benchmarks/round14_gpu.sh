#!/usr/bin/env bash
# Device call of round 14 (2026-12-06). Engine only; one call carrying .whl and .gpu, from
# the committed tree:
#   git archive --format=tar.gz HEAD sdk core plugins benchmarks tests > .gpu/clean.tgz
#   command: rm -rf /tmp/c && mkdir -p /tmp/c && tar -xzf .gpu/clean.tgz -C /tmp/c \
#            && cp -r .whl .gpu /tmp/c/ && cd /tmp/c && bash benchmarks/round14_gpu.sh fp8
# Mode fp8: FP8 decode rows through the SDK's row GEMV (engine_sdk.layers.gemv with the
# e4m3 weight and its scale; the add+RMSNorm and gated SiLU launches included): its GPU
# tests, then W2 (batch 1, 128 in / 256 out) of bf16, FP8 with the row GEMV (2 and 4 weight
# rows a program), FP8 with the plugin's split-K GEMV and AWQ on the Qwen3-0.6B shape, the
# same for bf16 / FP8 on the Llama-3.1-8B shape, then the 0.6B FP8 kernel profile.
# Mode short, for a call with little device time left: the GPU tests of both row GEMVs,
# W2 on the 0.6B shape (SHORT_06B_VARIANTS, default bf16, FP8 rows, AWQ rows, AWQ split-K)
# and on the 8B shape (SHORT_8B_VARIANTS, the same default; SHORT_8B_SECONDS caps it).
# The 2026-12-06 call (tree 90c046a, when the row GEMV had an 8 MiB limit) ran
# SHORT_8B_VARIANTS=bf16,awq_rows_all,fp8_rows SHORT_8B_SECONDS=140: awq_rows_all (every
# layer) is what awq_rows runs now. More variants (fp8_gemv, awq_rows8, ...) in a longer
# call: SHORT_06B_VARIANTS=... SHORT_06B_SECONDS=280.
set -uo pipefail
MODE="${1:-fp8}"
source benchmarks/device_install.sh
nvidia-smi --query-gpu=name --format=csv,noheader
if [ "$MODE" = fp8 ]; then
    py 150 -m pytest -q -p no:cacheprovider tests/fused/test_gemv.py \
        plugins/fp8/tests/test_fp8_row_gemv.py 2>&1 | tail -2
    py 220 benchmarks/quant_decode_gpu.py --model .gpu/qwen3 --shapes qwen06b \
        --variants bf16,fp8_rows,fp8_rows4,fp8_gemv,awq_gemv --out "$OUT/w2_qwen06b.json" \
        2>&1 | tail -7
    py 150 benchmarks/quant_decode_gpu.py --model .gpu/qwen3 --shapes llama8b \
        --variants bf16,fp8_rows,fp8_gemv --out "$OUT/w2_llama8b.json" 2>&1 | tail -4
    py 60 benchmarks/profile_kernels_gpu.py --model .gpu/qwen3 --quantization fp8 --tokens 32 \
        --max-num-seqs 4 --out "$OUT/prof_qwen06b_fp8_rows.json" 2>&1 \
        | grep -v "Warning\|warn" | tail -12
fi
if [ "$MODE" = short ]; then
    py 70 -m pytest -q -p no:cacheprovider plugins/fp8/tests/test_fp8_row_gemv.py \
        plugins/awq/tests/test_awq_rows.py 2>&1 | tail -2
    py "${SHORT_06B_SECONDS:-190}" benchmarks/quant_decode_gpu.py --model .gpu/qwen3 \
        --shapes qwen06b --variants "${SHORT_06B_VARIANTS:-bf16,fp8_rows,awq_rows,awq_gemv}" \
        --out "$OUT/w2_qwen06b.json" 2>&1 | tail -8
    py "${SHORT_8B_SECONDS:-200}" benchmarks/quant_decode_gpu.py --model .gpu/qwen3 \
        --shapes llama8b --variants "${SHORT_8B_VARIANTS:-bf16,fp8_rows,awq_rows,awq_gemv}" \
        --out "$OUT/w2_llama8b.json" 2>&1 | tail -8
fi

