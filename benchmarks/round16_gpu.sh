#!/usr/bin/env bash
# Device call of round 16 (2026-12-07), run from the working tree (carry .whl and .gpu):
# the GPU tests of the AWQ GEMVs for one token (engine_awq.wide, engine_awq.rows), the FP8
# row GEMV and LoRA (the merged adapter in CUDA graphs); the Llama-3.1-8B shape's four
# launches per layer (benchmarks/rows_gemv_gpu.py: bf16, FP8, the AWQ row GEMV and
# engine_awq.wide, with the wide tiles swept first), whose AWQ table goes into the installed
# plugin; then W2 on the 8B shape: bf16, AWQ (today's default: wide on rows of 4096 or
# more), AWQ with wide off (round 15's default), FP8.
#   confirm: the wide GEMV's GPU tests (its accumulators summed over a chunk's words each
#   slice since call 1: fewer registers), W2 on the 8B shape (bf16, AWQ as today's default,
#   AWQ narrow, FP8), W1 (1024 x 512 in / 256 out) of the 8B shape in bf16 and FP8 and of
#   the 0.6B shape with the fp8 and the bf16 KV cache (W1_RUNS: which of llama8b_fp8,
#   llama8b_bf16, qwen06b_fp8kv, qwen06b_bf16 run, in that order), then (SWEEP_S > 0) the
#   8B launches again.
set -uo pipefail
MODE="${1:-sweep}"
export PYTHONUNBUFFERED=1
source benchmarks/device_install.sh  # prints the card's name, sets BW (its copy rate, GB/s)
w1() {  # w1 NAME MODEL [engine args]: offline W1, output tokens/s (NAME in W1_RUNS only)
    local name=$1 model=$2; shift 2
    [[ " $W1_RUNS " = *" $name "* ]] || return 0
    py "${W1_SECONDS:-150}" -m engine.cli.main bench throughput --model "$model" \
        --load-format dummy --dtype bfloat16 --num-prompts 1024 --input-len 512 \
        --output-len 256 "$@" --save-result "$OUT/w1_$name.json" > "$OUT/w1_$name.log" 2>&1
    grep -m2 "output_tokens_per_s\|tok/s\|Error\|error:" "$OUT/w1_$name.log" | sed "s/^/$name: /"
}
if [ "$MODE" = confirm ]; then
    py 60 -m pytest -q -p no:cacheprovider plugins/awq/tests/test_awq_wide.py 2>&1 | tail -2
    py "${W2_SECONDS:-150}" benchmarks/quant_decode_gpu.py --model .gpu/qwen3 --shapes llama8b \
        --variants "${W2_VARIANTS:-bf16,awq_rows,awq_narrow,fp8_rows}" \
        --out "$OUT/w2_llama8b.json" 2>&1 | tail -6
    W1_RUNS="${W1_RUNS:-llama8b_bf16 llama8b_fp8 qwen06b_bf16 qwen06b_fp8kv}"
    w1 llama8b_fp8 /tmp/quant_decode/llama-8b --quantization fp8
    w1 llama8b_bf16 /tmp/quant_decode/llama-8b
    w1 qwen06b_fp8kv .gpu/qwen3 --kv-cache-dtype fp8
    w1 qwen06b_bf16 .gpu/qwen3
    [ "${SWEEP_S:-60}" = 0 ] || py "${SWEEP_TIMEOUT:-100}" benchmarks/rows_gemv_gpu.py \
        --models Llama-3.1-8B --sweep-s "${SWEEP_S:-60}" --copy-gbps "$BW" \
        --out "$OUT/rows_gemv.json" --write-tuned "$OUT/tuned" 2>&1 \
        | grep -v "^   \|\.\.\.$" | tee "$OUT/rows_gemv.txt" | tail -9
    exit 0
fi
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
