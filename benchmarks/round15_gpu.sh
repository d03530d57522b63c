#!/usr/bin/env bash
# Device calls of round 15 (2026-12-07), run from the working tree (carry .whl and .gpu):
#   sweep: batch-1 decode with one LoRA adapter, plain and merged into the weights
#          (benchmarks/lora_gpu.py --parts decode: base, base with LoRA on, adapter,
#          adapter_merged), then the row-GEMV tile sweep (benchmarks/rows_gemv_gpu.py: the
#          four launches of a layer at one token, bf16 / FP8 / AWQ, AWQ and FP8 tiles
#          swept), which writes the AWQ tile table into $OUT/tuned (copy it to
#          plugins/awq/engine_awq/tuned/ for the next call) and into the installed plugin
#          for W2 on the 0.6B shape (bf16, FP8 rows with today's and round 14's rows a
#          program, AWQ rows).
#   w2:    the GPU tests of the row GEMVs (bf16, FP8, AWQ) and of LoRA (the merged adapter
#          in CUDA graphs included), then W2 (batch 1, 128 in / 256 out) on the shapes in
#          W2_SHAPES (default qwen06b,llama8b): bf16, FP8 rows (today's rows a program,
#          round 15's measured run with the gated launch at 1, and round 14's), AWQ rows
#          with the tree's measured tiles and with the built-in default.
set -uo pipefail
MODE="${1:-sweep}"
export PYTHONUNBUFFERED=1
source benchmarks/device_install.sh  # prints the card's name, sets BW (its copy rate, GB/s)
if [ "$MODE" = sweep ]; then
    py "${LORA_SECONDS:-160}" benchmarks/lora_gpu.py --parts decode \
        --decode-runs "${LORA_RUNS:-base,adapter,adapter_merged}" --out "$OUT/lora_decode.json" \
        2>&1 | grep -v "Warning\|warn" | tail -6
    py "${SWEEP_TIMEOUT:-210}" benchmarks/rows_gemv_gpu.py --sweep-s "${SWEEP_S:-150}" \
        --copy-gbps "$BW" --out "$OUT/rows_gemv.json" --write-tuned "$OUT/tuned" 2>&1 \
        | grep -v "^   \|\.\.\.$" | tee "$OUT/rows_gemv.txt" | tail -40
    # the measured AWQ tiles into the installed plugin, then W2 on the 0.6B shape
    cp "$OUT"/tuned/engine_awq/*.json /tmp/site2/engine_awq/tuned/ && echo "AWQ tiles installed"
    [ "${W2_VARIANTS:-}" = none ] || py "${W2_SECONDS:-170}" benchmarks/quant_decode_gpu.py --model .gpu/qwen3 --shapes qwen06b \
        --variants "${W2_VARIANTS:-bf16,fp8_rows,fp8_rows2,awq_rows}" --out "$OUT/w2_qwen06b.json" \
        2>&1 | tail -8
fi
if [ "$MODE" = w2 ]; then
    py 150 -m pytest -q -p no:cacheprovider plugins/fp8/tests/test_fp8_row_gemv.py \
        plugins/awq/tests/test_awq_rows.py tests/fused/test_gemv.py tests/lora/test_lora_cuda.py \
        2>&1 | tail -4
    VARIANTS="${W2_VARIANTS:-bf16,fp8_rows,fp8_rows4,fp8_rows2,awq_rows,awq_rows_default}"
    for shape in ${W2_SHAPES:-qwen06b llama8b}; do
        py "${W2_SECONDS:-230}" benchmarks/quant_decode_gpu.py --model .gpu/qwen3 \
            --shapes "$shape" --variants "$VARIANTS" --out "$OUT/w2_$shape.json" 2>&1 | tail -8
    done
fi
