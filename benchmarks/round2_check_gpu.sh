#!/usr/bin/env bash
# One device call (repository root, nvidia-h200) for the GPU work that had only run on a
# CPU: decode-graph, LoRA and mask-table tests on the GPU; batch-1 decode of the 0.6B shape
# with the quantized GEMVs on and off; the grammar-mask cost at batch 32 and 256; where
# W4's time goes (step timeline and kernel families); the LoRA table. Needs .whl/ and
# .gpu/qwen3/ carried. Usage: bash benchmarks/round2_check_gpu.sh   (writes under $OUT)
set -uo pipefail
source benchmarks/device_install.sh
py 150 -m pytest -q -p no:cacheprovider tests/model/test_decode_graph_cuda.py tests/lora/test_lora_cuda.py \
    tests/fused/test_lora_merged_expand.py tests/fused/test_lora_kernels.py \
    tests/structured_output/test_mask_table.py tests/structured_output/test_packed_masks_outlines.py \
    2>&1 | tail -8 | tee "$OUT/gpu_tests.txt"
(cd benchmarks && py 120 w4_profile_gpu.py --model ../.gpu/qwen3 --out "$OUT/w4_profile.json" 2>&1 \
    | grep -v -i warn | tail -45)
py 130 benchmarks/quant_decode_gpu.py --model .gpu/qwen3 --shapes qwen06b \
    --out "$OUT/quant_decode_06b.json" 2>&1 | grep -v '^\$' | tail -8
py 60 benchmarks/structured_masks.py --device cuda --batch 32,256 --steps 120 --warmup 20 \
    --forward-ms 0,1 --tokenizer-dir .gpu/qwen3 --out "$OUT/structured_masks.json" 2>&1 | tail -12
py 150 benchmarks/lora_gpu.py --quick --out "$OUT/lora_gpu.json" 2>&1 | tail -25
