#!/usr/bin/env bash
# Device call for the quantized decode (2026-12-05): the fused add+RMSNorm GEMV tests
# (AWQ, FP8, bf16) on the GPU, a tile sweep at 1 and 4 tokens that writes the tuned tables
# (copied into this tree, then reinstalled), and W2 of bf16 / FP8 / AWQ on the Qwen3-0.6B
# shape with those tables. Needs .whl/ and .gpu/qwen3/ carried. Writes under $OUT.
#   bash benchmarks/round5_quant_gpu.sh [SWEEP_S] [SHAPES]
set -uo pipefail
SWEEP_S="${1:-200}"
SHAPES="${2:-qwen06b}"
source benchmarks/device_install.sh
py 120 -m pytest -q -p no:cacheprovider tests/fused/test_gemv.py \
    plugins/awq/tests/test_awq_gemv.py plugins/fp8/tests/test_fp8_gemv.py -k "norm or graph" \
    2>&1 | tail -4 | tee "$OUT/gpu_tests.txt"
if [ "$SWEEP_S" != 0 ]; then
    py $((SWEEP_S + 150)) benchmarks/quant_gemv_gpu.py --tokens 1,4 --sweep-s "$SWEEP_S" \
        --sweep-tokens 1,4 --write-tuned "$OUT/tuned" --out "$OUT/quant_gemv.json" \
        > "$OUT/quant_gemv.txt" 2>&1
    grep -A30 "== ms per call" "$OUT/quant_gemv.txt" | head -32; grep "wrote\|correctness" "$OUT/quant_gemv.txt"
    for p in awq fp8; do
        mkdir -p plugins/$p/engine_$p/tuned; cp "$OUT"/tuned/engine_$p/*.json plugins/$p/engine_$p/tuned/ 2>/dev/null || true
    done
    source benchmarks/device_install.sh
fi
py 400 benchmarks/quant_decode_gpu.py --model .gpu/qwen3 --shapes "$SHAPES" \
    --variants bf16,fp8_gemv,awq_gemv --out "$OUT/quant_decode.json" 2>&1 | tail -8
