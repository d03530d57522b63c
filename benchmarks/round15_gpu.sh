#!/usr/bin/env bash
# Device calls of round 15 (2026-12-07), run from the working tree (carry .whl and .gpu):
#   sweep: the row-GEMV tile sweep (benchmarks/rows_gemv_gpu.py: the four launches of a
#          layer at one token, bf16 / FP8 / AWQ, AWQ and FP8 tiles swept) writes the AWQ
#          table into $OUT/tuned and build/tuned (kept on a warm machine for the next
#          call), installs it in the tree, then W2 (batch 1, 128 in / 256 out) on the
#          Qwen3-0.6B shape: bf16, FP8 rows (2 and 4 rows a program), AWQ rows with the
#          measured tiles and with the built-in default (awq_rows_default).
#   w2_8b: the same W2 variants on the Llama-3.1-8B shape (the table from build/tuned when
#          the machine kept it), after the GPU tests of both row GEMVs.
set -uo pipefail
MODE="${1:-sweep}"
export PYTHONUNBUFFERED=1
name=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)
echo "$name"
case "$name" in *H100*) BW=3350 ;; *) BW=4100 ;; esac
if [ "$MODE" = sweep ]; then
    timeout "${SWEEP_TIMEOUT:-300}" python3 benchmarks/rows_gemv_gpu.py \
        --sweep-s "${SWEEP_S:-230}" --copy-gbps "$BW" --out "$OUT/rows_gemv.json" \
        --write-tuned "$OUT/tuned" 2>&1 | grep -v "^   \|\.\.\.$" | tee "$OUT/rows_gemv.txt" | tail -40
    mkdir -p build && cp -r "$OUT/tuned" build/
fi
if [ -d build/tuned/engine_awq ]; then
    cp build/tuned/engine_awq/*.json plugins/awq/engine_awq/tuned/
    echo "AWQ tiles: $(ls plugins/awq/engine_awq/tuned/)"
fi
source benchmarks/device_install.sh
VARIANTS="${W2_VARIANTS:-bf16,fp8_rows,fp8_rows4,awq_rows,awq_rows_default}"
if [ "$MODE" = sweep ]; then
    py "${W2_SECONDS:-230}" benchmarks/quant_decode_gpu.py --model .gpu/qwen3 \
        --shapes qwen06b --variants "$VARIANTS" --out "$OUT/w2_qwen06b.json" 2>&1 | tail -8
fi
if [ "$MODE" = w2_8b ]; then
    py 90 -m pytest -q -p no:cacheprovider plugins/fp8/tests/test_fp8_row_gemv.py \
        plugins/awq/tests/test_awq_rows.py 2>&1 | tail -2
    py "${W2_SECONDS:-330}" benchmarks/quant_decode_gpu.py --model .gpu/qwen3 \
        --shapes llama8b --variants "$VARIANTS" --out "$OUT/w2_llama8b.json" 2>&1 | tail -8
fi
