#!/usr/bin/env bash
# One device call (repository root, nvidia-h200) for the quantized split-K GEMVs: their GPU
# tests (every kernel against its dequantized reference, CUDA-graph replays), batch-1
# decode of bf16 / FP8 / AWQ with the GEMVs on and off (quant_decode_gpu.py), then the
# per-projection kernel table (quant_gemv_gpu.py). Needs .whl/ and .gpu/qwen3/ carried.
# Usage: bash benchmarks/quant_check_gpu.sh [shapes]   (writes under $OUT)
set -uo pipefail
source benchmarks/device_install.sh
SHAPES="${1:-llama8b}"
tests="$OUT/gpu_tests.txt"
for t in plugins/awq/tests/test_awq_gemv.py plugins/fp8/tests/test_fp8_gemv.py \
         tests/quantization/test_quant_gemv_switch.py; do
    ENGINE_QUANT_GEMV=1 py 90 -m pytest -q -p no:cacheprovider "$t" 2>&1 | tail -3 | tee -a "$tests"
done
py 240 benchmarks/quant_decode_gpu.py --model .gpu/qwen3 --shapes "$SHAPES" \
    --out "$OUT/quant_decode.json" 2>&1 | grep -v '^\$' | tail -14
py 170 benchmarks/quant_gemv_gpu.py --tokens 1,4,16 --sweep-s 20 --out "$OUT/quant_gemv.json" \
    > "$OUT/quant_gemv.txt" 2>&1; tail -42 "$OUT/quant_gemv.txt"
