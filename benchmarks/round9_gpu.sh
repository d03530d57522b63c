#!/usr/bin/env bash
# Device calls planned on 2026-12-05 (round 9, written while no device was lent: nothing
# here has run yet). Engine only; each mode is one call carrying .whl and .gpu (.gpu/qwen3:
# the Qwen3-0.6B-shaped folder with the Qwen3 tokenizer). Run the committed tree:
#   git archive --format=tar.gz HEAD sdk core plugins benchmarks tests > .gpu/clean.tgz
#   command: mkdir -p /tmp/c && tar -xzf .gpu/clean.tgz -C /tmp/c && cp -r .whl .gpu /tmp/c/ \
#            && cd /tmp/c && bash benchmarks/round9_gpu.sh MODE
# Modes:
#   check    the GPU tests of what round 9 changed, compiled for real (the in-launch split
#            merge and its counters, the fused q/k/v + KV-cache write, the LoRA epilogue's
#            one-load parts, the norm shrink, the decode graph's sampling launch), then W2
#            with each change off and on; W2 now samples at temperature 1.0 by default, as
#            vllm bench latency does (round 8 and before: greedy), so greedy is timed too
#   decode   W2 and the Llama-8B shape at batch 1 (side_by_side.py --engine-only), LoRA
#            batch-1 decode with an adapter and W1 over 4 adapters (lora_gpu.py --quick),
#            then batch-1 LoRA decode with ENGINE_LORA_SHRINK_IN_GEMV=1 (no shrink launch;
#            make it the default if it passed `check` and is faster)
#   compile  W2 with ENGINE_TORCH_COMPILE=1 against 0 (issue 14 item 2: not yet measured)
set -uo pipefail
MODE="${1:?check, decode or compile}"
source benchmarks/device_install.sh
nvidia-smi --query-gpu=name --format=csv,noheader
if [ "$MODE" = check ]; then
    py 240 -m pytest -q -x -p no:cacheprovider plugins/triton/tests tests/fused \
        tests/lora/test_lora_cuda.py tests/model/test_decode_graph_cuda.py -k "not inside" \
        2>&1 | tail -8
    # the LoRA shrink inside the GEMV's launch spins on a counter: alone, with a short
    # timeout, so a hang (if the GPU broke the forward-progress assumption) costs 60 s
    py 60 -m pytest -q -x -p no:cacheprovider tests/fused/test_lora_gemv_epilogue.py \
        -k inside 2>&1 | tail -3
    w2 base
    w2 greedy --temperature 0
    ENGINE_TRITON_SPLIT_MERGE=0 w2 two_launch_merge
    ENGINE_FUSED_KV_STORE=0 w2 backend_store
    ENGINE_TRITON_SPLIT_MERGE=0 ENGINE_FUSED_KV_STORE=0 w2 round8_launches
elif [ "$MODE" = decode ]; then
    py 200 benchmarks/side_by_side.py --engine-only --model .gpu/qwen3 --parts w2,llama8b \
        --out "$OUT/engine_w2_8b.json" 2>&1 | tail -3
    py 250 benchmarks/lora_gpu.py --quick --parts decode,w1 --out "$OUT/lora_gpu.json" \
        2>&1 | tail -20
    ENGINE_LORA_SHRINK_IN_GEMV=1 py 120 benchmarks/lora_gpu.py --quick --parts decode \
        --out "$OUT/lora_gpu_shrink_in_gemv.json" 2>&1 | tail -8
else
    w2 compile0
    ENGINE_TORCH_COMPILE=1 w2 compile1
    grep -B2 -A8 -m1 "Traceback\|Error" "$OUT/w2_compile1.log" | tail -14
fi
