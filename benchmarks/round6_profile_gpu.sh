#!/usr/bin/env bash
# Device call (2026-12-05, round 6): where the quantized batch-1 decode spends its time.
# Kernel profiles (benchmarks/profile_kernels_gpu.py) of bf16, FP8 (online) and AWQ on the
# Llama-3.1-8B and Qwen3-0.6B shapes, dummy weights, CUDA graphs on. Needs .whl/ carried.
#   bash benchmarks/round6_profile_gpu.sh MODEL [SHAPES] [TOKENS]
# MODEL: a Qwen3-0.6B-shaped folder (config + tokenizer); the 8B shape reuses its tokenizer.
set -uo pipefail
MODEL="$(realpath "${1:?model folder}")"
SHAPES="${2:-llama8b,qwen06b}"
TOKENS="${3:-64}"
source benchmarks/device_install.sh
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader
DIRS=$(cd benchmarks && python3 - "$MODEL" <<'PY'
import sys
from pathlib import Path
from side_by_side import llama_dir
from suite_extra import awq_variant
base = Path(sys.argv[1]).resolve()
llama = llama_dir(Path("/tmp/prof"), base)
print(base, awq_variant(base), llama, awq_variant(llama))
PY
)
read -r QWEN QWEN_AWQ LLAMA LLAMA_AWQ <<<"$DIRS"
for shape in ${SHAPES//,/ }; do
    if [ "$shape" = llama8b ]; then base=$LLAMA awq=$LLAMA_AWQ; else base=$QWEN awq=$QWEN_AWQ; fi
    for v in awq bf16 fp8; do
        case $v in
            bf16) args=(--model "$base") ;;
            fp8) args=(--model "$base" --quantization fp8) ;;
            awq) args=(--model "$awq") ;;
        esac
        echo "=== $shape $v"
        py 90 benchmarks/profile_kernels_gpu.py "${args[@]}" --tokens "$TOKENS" --max-num-seqs 4 \
            --out "$OUT/prof_${shape}_$v.json" 2>&1 | grep -v "Warning\|warn" | tail -32
    done
done
