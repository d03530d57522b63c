#!/usr/bin/env bash
# Device calls planned on 2026-12-05 (round 7); each mode is one call. Writes under $OUT.
#   call 1 (carry .whl-vllm/main.tar.xz.00 only; the next call within 30 s):
#       mkdir -p $HOME/vparts && mv .whl-vllm/main.tar.xz.00 $HOME/vparts/
#   call 2 (carry .whl-vllm/main.tar.xz.01, .whl-vllm/SHA256SUMS, .carry, .whl):
#       bash benchmarks/round7_gpu.sh sbs
#     vLLM unpacked; Engine's Triton attention against vLLM's FlashAttention 3 on the same
#     paged cache (attention_fa3_gpu.py); then Engine and vLLM 0.26 in this call: W1, and
#     batch-1 decode of the Llama-3.1-8B shape with online FP8 and with AWQ 4-bit (both
#     engines --quantization fp8 / the same AutoAWQ-config folder), each with its ratio
#   call 3 (carry .whl, .gpu; Engine only, any warm or fresh machine):
#       bash benchmarks/round7_gpu.sh lora
#     multi-LoRA on the GPU (lora_gpu.py: kernel check and times, W1 mixed over 4 adapters,
#     batch-1 decode with an adapter), then W3 at c=256 served (Engine's client: TPOT p99
#     against p50 with chunked prefill, issue 14 item 3), then W2 with and without
#     ENGINE_TORCH_COMPILE=1 (inductor's forward in the decode graph)
#   call 4 (carry .whl, .gpu): bash benchmarks/round7_gpu.sh profile
#     the bf16 / FP8 / AWQ 8B decode profiles with the fused add+RMSNorm GEMV on and off
#     (ENGINE_FUSED_NORM=0)
set -uo pipefail
MODE="${1:?sbs, lora or profile}"
if [ "$MODE" = sbs ]; then
    mkdir -p "$HOME/vparts"
    mv .whl-vllm/main.tar.xz.01 .whl-vllm/SHA256SUMS "$HOME/vparts/" 2>/dev/null
    bash .carry/setup.sh || exit 1
    source benchmarks/device_install.sh
    nvidia-smi --query-gpu=name --format=csv,noheader
    PYTHONPATH="$PYTHONPATH:$HOME/v/site" py 90 benchmarks/attention_fa3_gpu.py \
        --out "$OUT/attention_fa3.json" 2>&1 | tail -10
    py 430 benchmarks/side_by_side.py --parts w1,llama8b_fp8,llama8b_awq,prefill --model "$HOME/v/model" \
        --out "$OUT/sbs_round7.json" 2>&1 | tail -8
elif [ "$MODE" = lora ]; then
    source benchmarks/device_install.sh
    nvidia-smi --query-gpu=name --format=csv,noheader
    py 300 benchmarks/lora_gpu.py --quick --parts kernels,decode,w1 --out "$OUT/lora_gpu.json" \
        2>&1 | tail -30
    py 240 benchmarks/serve_side_by_side.py --parts w3 --engine-only --model "$(realpath .gpu/qwen3)" \
        --loads 256:1024 --out "$OUT/w3_tpot.json" 2>&1 | tail -6
    # issue 14 item 2: does torch.compile help the captured decode step? W2, one graph size
    for c in 0 1; do
        ENGINE_TORCH_COMPILE=$c py 200 -m engine.cli.main bench latency --model .gpu/qwen3 \
            --load-format dummy --dtype bfloat16 --batch-size 1 --input-len 128 \
            --output-len 256 --num-iters 3 --num-iters-warmup 1 --max-num-seqs 1 \
            --save-result "$OUT/w2_compile$c.json" 2>&1 | tail -2 | sed "s/^/compile=$c /"
    done
else
    for fused in 1 0; do
        ENGINE_FUSED_NORM=$fused bash benchmarks/round6_profile_gpu.sh .gpu/qwen3 llama8b 32 \
            2>&1 | grep -A3 "^===" | grep -v "^--" | sed "s/^/fused=$fused /"
        mkdir -p "$OUT/fused$fused" && mv "$OUT"/prof_*.json "$OUT/fused$fused/" 2>/dev/null
    done
fi
