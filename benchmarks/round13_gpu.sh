#!/usr/bin/env bash
# Device calls of round 13 (2026-12-06). Engine only; each mode is one call carrying .whl
# and .gpu, from the committed tree:
#   git archive --format=tar.gz HEAD sdk core plugins benchmarks tests > .gpu/clean.tgz
#   command: rm -rf /tmp/c && mkdir -p /tmp/c && tar -xzf .gpu/clean.tgz -C /tmp/c \
#            && cp -r .whl .gpu /tmp/c/ && cd /tmp/c && bash benchmarks/round13_gpu.sh MODE
# Modes:
#   lora    the dense LoRA path with B block-diagonal over the slices and the one-hot slot
#           lookup (four launches a projection): its GPU tests, the kernel table, the full
#           W1 over 4 adapters + base (issue 19's >= 80% of base), then kernel profiles of
#           the 0.6B shape's batch-1 decode in bf16, FP8 and AWQ (issue 23: why the
#           quantized W2 is slower than bf16 there)
#   lora2   the dense path's expand as one Triton launch that masks as it loads (two
#           launches a projection): its GPU tests, the kernel table (Triton and torch
#           expands), the full W1 over 4 adapters + base with each expand
#   lora3   after the threshold went to 16 tokens (both): the LoRA GPU tests, the full
#           W1 over 4 adapters + base, batch-1 decode with an adapter, then the JSON
#           schema at batch 256 (2 runs)
#   schema  the JSON schema at batch 256 (3 runs; issue 15's <= 10%)
# The vLLM side runs through round11_gpu.sh's sbs mode (SBS_PARTS).
set -uo pipefail
MODE="${1:?lora, lora2, lora3 or schema}"
source benchmarks/device_install.sh
nvidia-smi --query-gpu=name --format=csv,noheader
if [ "$MODE" = lora ]; then
    py 80 -m pytest -q -p no:cacheprovider tests/fused/test_lora_dense.py 2>&1 | tail -2
    ENGINE_LORA_DENSE_MIN_TOKENS=1 py 90 -m pytest -q -p no:cacheprovider \
        tests/lora/test_lora_cuda.py -k "not inside" 2>&1 | tail -2
    py 200 benchmarks/lora_gpu.py --parts w1 --w1-configs base,mixed \
        --out "$OUT/lora_w1.json" 2>&1 | grep "^W1"
    py 70 benchmarks/lora_gpu.py --quick --parts kernels --out "$OUT/lora_kernels.json" \
        2>&1 | grep "LoRA, \|check" | tail -12
    AWQ=$(cd benchmarks && python3 -c "
from pathlib import Path
from suite_extra import awq_variant
print(awq_variant(Path('../.gpu/qwen3').resolve()))")
    for v in bf16 fp8 awq; do
        case $v in
            bf16) args=(--model .gpu/qwen3) ;;
            fp8) args=(--model .gpu/qwen3 --quantization fp8) ;;
            awq) args=(--model "$AWQ") ;;
        esac
        echo "=== qwen06b $v"
        py 60 benchmarks/profile_kernels_gpu.py "${args[@]}" --tokens 32 --max-num-seqs 4 \
            --out "$OUT/prof_qwen06b_$v.json" 2>&1 | grep -v "Warning\|warn" | tail -24
    done
elif [ "$MODE" = lora2 ]; then
    py 120 -m pytest -q -p no:cacheprovider tests/fused/test_lora_dense.py 2>&1 | tail -2
    py 200 benchmarks/lora_gpu.py --parts w1 --w1-configs base,mixed \
        --out "$OUT/lora_w1.json" 2>&1 | grep "^W1"
    ENGINE_LORA_DENSE_EXPAND=torch py 100 benchmarks/lora_gpu.py --parts w1 \
        --w1-configs mixed --out "$OUT/lora_w1_torch_expand.json" 2>&1 | grep "^W1" \
        | sed "s/^/torch expand: /"
    py 90 benchmarks/lora_gpu.py --quick --parts kernels --out "$OUT/lora_kernels.json" \
        2>&1 | grep "LoRA, \|check" | tail -12
    ENGINE_LORA_DENSE_MIN_TOKENS=1 py 90 -m pytest -q -p no:cacheprovider \
        tests/lora/test_lora_cuda.py -k "not inside" 2>&1 | tail -2
elif [ "$MODE" = lora3 ]; then
    py 100 -m pytest -q -p no:cacheprovider tests/fused/test_lora_dense.py \
        tests/lora/test_lora_cuda.py -k "not inside" 2>&1 | tail -2
    py 200 benchmarks/lora_gpu.py --parts w1 --w1-configs base,mixed \
        --out "$OUT/lora_w1.json" 2>&1 | grep "^W1"
    py 70 benchmarks/lora_gpu.py --quick --parts decode --decode-runs base,adapter \
        --out "$OUT/lora_decode.json" 2>&1 | grep "batch-1"
    (cd benchmarks && py 150 structured_e2e_gpu.py --model ../.gpu/qwen3 --num-seqs 256 \
        --runs 2 --out "$OUT/structured_e2e.json" > "$OUT/structured_e2e.log" 2>&1)
    grep '"added\|Error' "$OUT/structured_e2e.log" | tail -6
else
    (cd benchmarks && py 300 structured_e2e_gpu.py --model ../.gpu/qwen3 --num-seqs 256 \
        --runs 3 --out "$OUT/structured_e2e.json" > "$OUT/structured_e2e.log" 2>&1)
    grep '"added\|Error' "$OUT/structured_e2e.log" | tail -6
fi
