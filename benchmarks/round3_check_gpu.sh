#!/usr/bin/env bash
# One device call (repository root, nvidia-h200) for the fused decode GEMVs, the LoRA
# shrink in parts and the W4 step timeline: GPU tests, the fused-kernel table, W2 and the
# Llama-8B shape (async, and with ENGINE_GEMV=0 for the unfused layers), correctness of
# async scheduling and of the backends, W4's steps twice (prefix caching off), the LoRA
# table. Needs .whl/ and .gpu/qwen3/ carried. Usage: bash benchmarks/round3_check_gpu.sh
set -uo pipefail
source benchmarks/device_install.sh
py 170 -m pytest -q -p no:cacheprovider tests/fused tests/model/test_decode_graph_cuda.py \
    tests/lora/test_lora_cuda.py 2>&1 | tail -6 | tee "$OUT/gpu_tests.txt"
py 60 benchmarks/async_check_gpu.py 2>&1 | grep -v -i warn | tail -5 | tee -a "$OUT/gpu_tests.txt"
py 40 benchmarks/decode_kernels_gpu.py --parts fused --out "$OUT/fused_kernels.json" 2>&1 | tail -7
py 90 benchmarks/side_by_side.py --engine-only --model .gpu/qwen3 --parts w2,llama8b \
    --out "$OUT/engine_w2_8b.json" 2>&1 | tail -3
ENGINE_GEMV=0 py 40 benchmarks/side_by_side.py --engine-only --model .gpu/qwen3 --parts w2 \
    --out "$OUT/engine_w2_gemv0.json" 2>&1 | tail -2
(cd benchmarks && py 100 w4_profile_gpu.py --model ../.gpu/qwen3 --runs 2 --no-prefix-caching \
    --no-profiler --out "$OUT/w4_timeline.json" 2>&1 | grep -v -i warn | tail -16)
py 130 benchmarks/lora_gpu.py --quick --out "$OUT/lora_gpu.json" 2>&1 | tail -16
