#!/usr/bin/env bash
# Device call of round 16 (2026-12-07), run from the working tree (carry .whl and .gpu):
# the GPU tests of the AWQ GEMVs for one token (engine_awq.wide, engine_awq.rows), the FP8
# row GEMV and LoRA (the merged adapter in CUDA graphs); the Llama-3.1-8B shape's four
# launches per layer (benchmarks/rows_gemv_gpu.py: bf16, FP8, the AWQ row GEMV and
# engine_awq.wide, with the wide tiles swept first), whose AWQ table goes into the installed
# plugin; then W2 on the 8B shape: bf16, AWQ (today's default: wide on rows of 4096 or
# more), AWQ with wide off (round 15's default), FP8.
set -uo pipefail
export PYTHONUNBUFFERED=1
name=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)
echo "$name"
case "$name" in *H100*) BW=3350 ;; *) BW=4100 ;; esac
source benchmarks/device_install.sh
py "${TESTS_SECONDS:-120}" -m pytest -q -p no:cacheprovider plugins/awq/tests/test_awq_wide.py \
    plugins/awq/tests/test_awq_rows.py plugins/fp8/tests/test_fp8_row_gemv.py \
    tests/lora/test_lora_cuda.py 2>&1 | tail -4
py "${SWEEP_TIMEOUT:-140}" benchmarks/rows_gemv_gpu.py --models Llama-3.1-8B \
    --sweep-s "${SWEEP_S:-90}" --copy-gbps "$BW" --out "$OUT/rows_gemv.json" \
    --write-tuned "$OUT/tuned" 2>&1 | grep -v "^   \|\.\.\.$" | tee "$OUT/rows_gemv.txt" | tail -16
cp "$OUT"/tuned/engine_awq/*.json /tmp/site2/engine_awq/tuned/ && echo "AWQ tiles installed"
py "${W2_SECONDS:-240}" benchmarks/quant_decode_gpu.py --model .gpu/qwen3 --shapes llama8b \
    --variants "${W2_VARIANTS:-bf16,awq_rows,awq_narrow,fp8_rows}" --out "$OUT/w2_llama8b.json" \
    2>&1 | tail -8
