#!/usr/bin/env bash
# Device calls planned on 2026-12-05 (round 8), Engine only; each mode is one call, carrying
# .whl and .gpu (.gpu/qwen3: the Qwen3-0.6B-shaped folder; .gpu/triton_old_kernels.py: the
# Triton attention kernels before the masked/unmasked tile split, from `git show
# 3128126:plugins/triton/engine_triton/kernels.py`). Writes under $OUT.
#   bash benchmarks/round8_gpu.sh attention   prefill tile sweep and before/after (attention_
#                                             prefill_sweep_gpu.py), then W2 with and without
#                                             ENGINE_TORCH_COMPILE=1 (issue 14 item 2)
#   bash benchmarks/round8_gpu.sh lora        multi-LoRA (lora_gpu.py: kernels, batch-1 decode
#                                             with an adapter, W1 over 4 adapters), then the
#                                             0.6B decode profiles of bf16 / FP8 / AWQ
#   bash benchmarks/round8_gpu.sh w3          W3 served at c=256 (TPOT p99 against p50)
set -uo pipefail
MODE="${1:?attention, lora or w3}"
source benchmarks/device_install.sh
nvidia-smi --query-gpu=name --format=csv,noheader
if [ "$MODE" = attention ]; then
    py 260 benchmarks/attention_prefill_sweep_gpu.py --old-kernels .gpu/triton_old_kernels.py \
        --out "$OUT/attention_prefill.json" 2>&1 | tail -40
    for c in 0 1; do
        ENGINE_TORCH_COMPILE=$c py 140 -m engine.cli.main bench latency --model .gpu/qwen3 \
            --load-format dummy --dtype bfloat16 --batch-size 1 --input-len 128 \
            --output-len 256 --num-iters 3 --num-iters-warmup 1 --max-num-seqs 1 \
            --save-result "$OUT/w2_compile$c.json" > "$OUT/w2_compile$c.log" 2>&1
        grep -m3 "ms per output token\|Error\|error:" "$OUT/w2_compile$c.log" | sed "s/^/compile=$c /"
    done
elif [ "$MODE" = lora ]; then
    py 250 benchmarks/lora_gpu.py --quick --parts kernels,decode,w1 --out "$OUT/lora_gpu.json" \
        2>&1 | tail -26
    bash benchmarks/round6_profile_gpu.sh .gpu/qwen3 qwen06b 32 2>&1 | grep -v "^Looking\|^Processing" \
        | grep -A12 "^===" | head -60
else
    py 400 benchmarks/serve_side_by_side.py --parts w3 --engine-only --model "$(realpath .gpu/qwen3)" \
        --loads 256:1024 --out "$OUT/w3_tpot.json" 2>&1 | tail -8
fi
