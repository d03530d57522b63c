#!/usr/bin/env bash
# One device call (repository root, nvidia-h200) that checks this round's GPU work and
# times it, Engine only (no vLLM anchor): GPU kernel tests, async-vs-sync parity, W2 and
# the Llama-8B shape async and sync, grammar-mask cost, quantized kernels, a batch-1
# kernel profile, prefill and W4. Needs .whl/ (outlines-core and the jsonschema stack,
# cp312) and .gpu/qwen3/ (the Qwen3 tokenizer files and the 0.6B config) carried.
# Usage: bash benchmarks/round_check_gpu.sh   (writes under $OUT)
set -uo pipefail
source benchmarks/device_install.sh
t() { local s=$1; shift; timeout "$s" "$@"; }
t 130 python3 -m pytest -q -p no:cacheprovider tests/fused tests/structured_output/test_mask_table.py tests/structured_output/test_packed_masks_outlines.py tests/model/test_decode_graph_cuda.py \
    tests/sampler/test_sampler_cuda.py plugins/awq/tests/test_awq_w4a16.py \
    plugins/fp8/tests/test_fp8_w8a16.py plugins/triton/tests 2>&1 | tail -6 | tee "$OUT/gpu_tests.txt"
t 60 python3 benchmarks/async_check_gpu.py 2>&1 | grep -v -i warn | tail -4 | tee -a "$OUT/gpu_tests.txt"
t 120 python3 benchmarks/side_by_side.py --engine-only --model .gpu/qwen3 --parts w2,llama8b \
    --sync --out "$OUT/engine_w2_8b.json" 2>&1 | tail -4
t 50 python3 benchmarks/structured_masks.py --device cuda --batch 32,256 --steps 24 \
    --tokenizer-dir .gpu/qwen3 --out "$OUT/structured_masks.json" 2>&1 | grep '_p50\|batch'
t 110 python3 benchmarks/quant_kernels_gpu.py --no-sweep --out "$OUT/quant_kernels_gpu.json" \
    > "$OUT/quant_kernels_gpu.txt" 2>&1; tail -25 "$OUT/quant_kernels_gpu.txt"
t 40 python3 benchmarks/profile_kernels_gpu.py --model .gpu/qwen3 --out "$OUT/profile.json" 2>&1 | tail -14
t 60 python3 benchmarks/side_by_side.py --engine-only --model .gpu/qwen3 --parts prefill,w4 \
    --out "$OUT/engine_prefill_w4.json" 2>&1 | tail -3
