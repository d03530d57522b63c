#!/usr/bin/env bash
# Device calls for the quantized decode (2026-12-05). Needs .whl/ carried; writes under $OUT.
#   bash benchmarks/round5_quant_gpu.sh sweep [SWEEP_S]
#       the fused add+RMSNorm GEMV tests (AWQ, FP8, bf16) on the GPU, then a tile sweep at 1
#       and 4 tokens that writes the tuned tables ($OUT/tuned, kept in $HOME/tuned for a
#       later call on the same machine)
#   bash benchmarks/round5_quant_gpu.sh decode MODEL [SHAPES]
#       the tables of $HOME/tuned (if any) copied into this tree, then W2 of bf16 / FP8 / AWQ
#       (qwen06b: MODEL, a Qwen3-0.6B-shaped folder; llama8b: the 8B shape beside it)
set -uo pipefail
MODE="${1:?sweep or decode}"
if [ "$MODE" = sweep ]; then
    source benchmarks/device_install.sh
    py 150 -m pytest -q -p no:cacheprovider tests/fused/test_gemv.py \
        plugins/awq/tests/test_awq_gemv.py plugins/fp8/tests/test_fp8_gemv.py \
        plugins/fp8/tests/test_fp8_w8a16.py -k "norm or graph or fuses" \
        2>&1 | tail -4 | tee "$OUT/gpu_tests.txt"
    SWEEP_S="${2:-150}"
    py $((SWEEP_S + 200)) benchmarks/quant_gemv_gpu.py --tokens 1,4 --sweep-s "$SWEEP_S" \
        --sweep-tokens 1,4 --write-tuned "$OUT/tuned" --out "$OUT/quant_gemv.json" \
        > "$OUT/quant_gemv.txt" 2>&1
    grep -A30 "== ms per call" "$OUT/quant_gemv.txt" | head -32
    grep "wrote\|correctness\|Error\|error" "$OUT/quant_gemv.txt" | head
    rm -rf "$HOME/tuned" && cp -r "$OUT/tuned" "$HOME/tuned"
else
    MODEL="${2:?model folder}"
    for p in awq fp8; do
        if ls "$HOME"/tuned/engine_$p/*.json >/dev/null 2>&1; then
            mkdir -p plugins/$p/engine_$p/tuned
            cp "$HOME"/tuned/engine_$p/*.json plugins/$p/engine_$p/tuned/
        fi
    done
    ls plugins/*/engine_*/tuned/ 2>/dev/null
    source benchmarks/device_install.sh
    py 420 benchmarks/quant_decode_gpu.py --model "$MODEL" --shapes "${3:-qwen06b,llama8b}" \
        --variants bf16,fp8_gemv,awq_gemv --out "$OUT/quant_decode.json" 2>&1 | tail -8
fi
