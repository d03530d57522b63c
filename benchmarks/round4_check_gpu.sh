#!/usr/bin/env bash
# Last device call of 2026-12-04: the GEMV tests after the SiLU fusion was dropped, W2 and
# the Llama-8B shape (Engine only), and LoRA decode with the split shrink (batch-1
# decode). Needs .whl/ and .gpu/qwen3/ carried. Writes under $OUT.
set -uo pipefail
source benchmarks/device_install.sh
py 60 -m pytest -q -p no:cacheprovider tests/fused/test_gemv.py tests/fused/test_split_k.py \
    2>&1 | tail -3 | tee "$OUT/gpu_tests.txt"
py 100 benchmarks/side_by_side.py --engine-only --model .gpu/qwen3 --parts w2,llama8b \
    --out "$OUT/engine_w2_8b.json" 2>&1 | tail -3
py 170 benchmarks/lora_gpu.py --quick --parts decode --out "$OUT/lora_gpu.json" 2>&1 | tail -14
