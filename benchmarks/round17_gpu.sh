#!/usr/bin/env bash
# Device calls of round 17 (2026-12-07), run from the working tree (carry .whl and .gpu):
# programmatic dependent launch (engine_sdk.layers.pdl) on the decode step's Triton kernels.
#   call1: the GPU tests of the kernels that now launch with PDL (ENGINE_PDL=1; eagerly,
#          each after the one before it), W2 (batch 1, 128 in / 256 out) on the Qwen3-0.6B shape with PDL
#          on and off for bf16, FP8 and AWQ (benchmarks/quant_decode_gpu.py *_nopdl; *_nopf:
#          PDL without the GEMVs' L2 prefetch of their weights), then
#          greedy tokens with PDL on and off (benchmarks/pdl_gpu.py: bf16, FP8, AWQ, fp8 KV
#          at batch 1 and 16, CUDA graphs).
#   one:   what fits one call: the greedy check (bf16, AWQ, FP8), W2 0.6B (bf16 and AWQ on
#          and off, bf16 without prefetch), W2 8B (bf16, AWQ, FP8 on and off), W1 0.6B.
#          ONE_PARTS picks the parts (default check,w2_06b,w2_8b,w1); three more exist:
#          compile  W2 0.6B with torch.compile's forward in the graph against eager, both
#                   one captured size (issue 14 item 2, never measured)
#          w1seqs   W1 0.6B at vLLM's H100/H200 offline defaults (--max-num-seqs 1024
#                   --max-num-batched-tokens 16384) and at 512, against Engine's (256, 8192)
#          stages   the row GEMVs' K loops pipelined (ENGINE_GEMV_LOOP_STAGES /
#                   ENGINE_AWQ_LOOP_STAGES 2): their GPU tests, then W2 8B against the plain
#                   loops (PDL off in both)
#   call2: W1 (1024 x 512 in / 256 out) on the 0.6B shape with PDL on and off, then W2 on
#          the Llama-3.1-8B shape with PDL on and off (bf16, AWQ, FP8; AWQ without prefetch).
set -uo pipefail
MODE="${1:-call1}"
export PYTHONUNBUFFERED=1
source benchmarks/device_install.sh  # prints the card's name, sets BW (its copy rate, GB/s)
w1() {  # w1 NAME [engine args]: offline W1 of the 0.6B shape, output tokens/s
    local name=$1; shift
    py "${W1_SECONDS:-90}" -m engine.cli.main bench throughput --model .gpu/qwen3 \
        --load-format dummy --dtype bfloat16 --num-prompts 1024 --input-len 512 \
        --output-len 256 "$@" --save-result "$OUT/w1_$name.json" > "$OUT/w1_$name.log" 2>&1
    grep -m2 "output_tokens_per_s\|tok/s\|Error\|error:" "$OUT/w1_$name.log" | sed "s/^/$name: /"
}
part() { [[ ",${ONE_PARTS:-check,w2_06b,w2_8b,w1}," == *",$1,"* ]]; }
if [ "$MODE" = one ]; then  # everything that fits one call, most needed first
    part check && py "${CHECK_SECONDS:-130}" benchmarks/pdl_gpu.py --model .gpu/qwen3 \
        --models "${CHECK_MODELS:-bf16,awq,fp8}" --out "$OUT/pdl_check.json" 2>&1 \
        | grep "PDL on\|failed\|Error" | tail -4
    part w2_06b && py "${W2_SECONDS:-140}" benchmarks/quant_decode_gpu.py --model .gpu/qwen3 \
        --shapes qwen06b --variants "${W2_06B:-bf16_pdl,bf16_nopdl,awq_pdl,awq_nopdl,bf16_nopf}" \
        --out "$OUT/w2_qwen06b.json" 2>&1 | tail -6
    part w2_8b && py "${W2_8B_SECONDS:-230}" benchmarks/quant_decode_gpu.py --model .gpu/qwen3 \
        --shapes llama8b --variants "${W2_8B:-bf16_pdl,bf16_nopdl,awq_pdl,awq_nopdl,fp8_pdl,fp8_nopdl}" \
        --out "$OUT/w2_llama8b.json" 2>&1 | tail -7
    if part w1 && [ "${W1_SKIP:-0}" != 1 ]; then
        (export ENGINE_PDL=1; W1_SECONDS=45 w1 qwen06b_pdl)
        (export ENGINE_PDL=0; W1_SECONDS=45 w1 qwen06b_nopdl)
    fi
    part compile && py "${COMPILE_SECONDS:-300}" benchmarks/quant_decode_gpu.py --model .gpu/qwen3 \
        --shapes qwen06b --variants bf16_seqs1,bf16_compile --out "$OUT/w2_compile.json" 2>&1 \
        | tail -3
    if part stages; then
        ENGINE_GEMV_LOOP_STAGES=2 ENGINE_AWQ_LOOP_STAGES=2 py 150 -m pytest -q -p no:cacheprovider \
            tests/fused/test_gemv.py plugins/awq/tests/test_awq_rows.py 2>&1 | tail -2
        py "${STAGES_SECONDS:-260}" benchmarks/quant_decode_gpu.py --model .gpu/qwen3 \
            --shapes llama8b --out "$OUT/w2_stages.json" --variants \
            bf16_nopdl,bf16_stages2,fp8_nopdl,fp8_stages2,awq_narrow,awq_rows_stages2 2>&1 | tail -7
    fi
    if part w1seqs; then  # the default tree's PDL setting; W1 of Engine's defaults is "w1"
        W1_SECONDS=90 w1 qwen06b_seqs512 --max-num-seqs 512 --max-num-batched-tokens 16384
        W1_SECONDS=90 w1 qwen06b_seqs1024 --max-num-seqs 1024 --max-num-batched-tokens 16384
        W1_SECONDS=60 w1 qwen06b_seqs256
    fi
fi
if [ "$MODE" = call1 ]; then
    ENGINE_PDL=1 py "${TESTS_SECONDS:-150}" -m pytest -q -p no:cacheprovider -x tests/fused/test_gemv.py \
        tests/fused/test_fused_ops.py tests/fused/test_row_sampler.py \
        plugins/triton/tests/test_triton_attention.py plugins/awq/tests/test_awq_rows.py \
        plugins/awq/tests/test_awq_wide.py plugins/fp8/tests/test_fp8_row_gemv.py 2>&1 | tail -3
    py "${W2_SECONDS:-220}" benchmarks/quant_decode_gpu.py --model .gpu/qwen3 --shapes qwen06b \
        --variants "${W2_VARIANTS:-bf16_pdl,bf16_nopdl,bf16_nopf,fp8_pdl,fp8_nopdl,awq_pdl,awq_nopdl,awq_nopf}" \
        --out "$OUT/w2_qwen06b.json" 2>&1 | tail -9
    py "${CHECK_SECONDS:-200}" benchmarks/pdl_gpu.py --model .gpu/qwen3 --out "$OUT/pdl_check.json" \
        2>&1 | grep "PDL on\|failed\|Error" | tail -6
fi
if [ "$MODE" = call2 ]; then
    (export ENGINE_PDL=1; w1 qwen06b_pdl)
    (export ENGINE_PDL=0; w1 qwen06b_nopdl)
    py "${W2_SECONDS:-370}" benchmarks/quant_decode_gpu.py --model .gpu/qwen3 --shapes llama8b \
        --variants "${W2_VARIANTS:-bf16_pdl,bf16_nopdl,awq_pdl,awq_nopdl,fp8_pdl,fp8_nopdl,awq_nopf}" \
        --out "$OUT/w2_llama8b.json" 2>&1 | tail -9
fi
