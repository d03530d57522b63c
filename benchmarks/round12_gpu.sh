#!/usr/bin/env bash
# Device calls of round 12 (2026-12-06, one H100 each; records and the calls' trees in
# benchmarks/results/2026-12-06-h100-round12/README.md). Engine only; each mode is one call
# carrying .whl and .gpu, from the committed tree:
#   git archive --format=tar.gz HEAD sdk core plugins benchmarks tests > .gpu/clean.tgz
#   command: rm -rf /tmp/c && mkdir -p /tmp/c && tar -xzf .gpu/clean.tgz -C /tmp/c \
#            && cp -r .whl .gpu /tmp/c/ && cd /tmp/c && bash benchmarks/round12_gpu.sh MODE
# Modes:
#   lora    the full W1 over 4 adapters + base (1024 prompts: issue 19's >= 80% of base),
#           the deferred gate/up expand's GPU tests and batch-1 decode A/B, GEMV block
#           width 8, the LoRA GPU tests (run first: 66% of base; the expand in the
#           activation's kernel won, block width 8 lost)
#   dense   the many-token LoRA path (lora_dense): tests, kernel table, W1 at thresholds
#           512 and 128, batch-1 decode
#   final   the JSON schema at batch 256 after deferred detokenization, W1 over adapters
#   mask    W1 over adapters with the dense path's mask in the model's dtype (not run:
#           the device time ran out)
#   schema  the JSON schema alone (3 runs)
# The vLLM side (W1 and the 8B shape beside vLLM, issue 23's FP8/AWQ table) ran through
# round11_gpu.sh's sbs / quant modes with SBS_PARTS / QUANT_PARTS / QUANT_ENGINE_PARTS.
set -uo pipefail
MODE="${1:?lora, dense, final, mask or schema}"
source benchmarks/device_install.sh
nvidia-smi --query-gpu=name --format=csv,noheader
if [ "$MODE" = lora ]; then
    # ordered by importance: one call's 600 s must hold it all
    py 220 benchmarks/lora_gpu.py --parts w1 --w1-configs base,mixed \
        --out "$OUT/lora_w1_full.json" 2>&1 | tail -4
    # the gate/up expand in the activation's kernel (ENGINE_LORA_EXPAND_IN_ACT): its GPU
    # tests, then batch-1 decode with it against without (and base, for the ratio)
    ENGINE_LORA_EXPAND_IN_ACT=1 py 80 -m pytest -q -p no:cacheprovider \
        tests/fused/test_lora_gemv_epilogue.py 2>&1 | tail -2
    py 80 benchmarks/lora_gpu.py --quick --parts decode --decode-runs base,adapter \
        --out "$OUT/lora_decode_default.json" 2>&1 | grep -i "adapter\|base" | tail -3
    ENGINE_LORA_EXPAND_IN_ACT=1 py 60 benchmarks/lora_gpu.py --quick --parts decode \
        --decode-runs adapter --out "$OUT/lora_decode_expand_in_act.json" 2>&1 \
        | grep "one adapter" | sed "s/^/expand_in_act /"
    ENGINE_LORA_GEMV_BLOCK_N=8 py 60 benchmarks/lora_gpu.py --quick --parts decode \
        --decode-runs adapter --out "$OUT/lora_decode_bn8.json" 2>&1 \
        | grep "one adapter" | sed "s/^/block_n=8 /"
    py 100 -m pytest -q -p no:cacheprovider tests/fused/test_lora_one_compile.py \
        tests/fused/test_lora_kernels.py tests/lora/test_lora_cuda.py -k "not inside" \
        2>&1 | tail -3
elif [ "$MODE" = dense ]; then
    # the many-token path (lora_dense: cuBLAS over every slot, masked) after the first
    # call's W1 (66% of base: prefill steps 54 ms against 22, decode at 256 10.8 ms
    # against 8.1): its tests, the kernel table (dense against the blocked kernels at
    # 1-4096 tokens), W1 base and mixed at the default threshold (512) and at 128, then
    # batch-1 decode with the deferred gate/up expand now the default
    py 90 -m pytest -q -p no:cacheprovider tests/fused/test_lora_dense.py \
        tests/fused/test_lora_gemv_epilogue.py 2>&1 | tail -2
    ENGINE_LORA_DENSE_MIN_TOKENS=1 py 90 -m pytest -q -p no:cacheprovider \
        tests/lora/test_lora_cuda.py -k "not inside" 2>&1 | tail -2
    py 90 benchmarks/lora_gpu.py --quick --parts kernels --out "$OUT/lora_kernels.json" \
        2>&1 | grep "LoRA, \|check" | tail -12
    py 200 benchmarks/lora_gpu.py --parts w1 --w1-configs base,mixed \
        --out "$OUT/lora_w1_dense512.json" 2>&1 | grep "^W1"
    ENGINE_LORA_DENSE_MIN_TOKENS=128 py 100 benchmarks/lora_gpu.py --parts w1 \
        --w1-configs mixed --out "$OUT/lora_w1_dense128.json" 2>&1 | grep "^W1" \
        | sed "s/^/threshold 128: /"
    py 80 benchmarks/lora_gpu.py --quick --parts decode --decode-runs base,adapter \
        --out "$OUT/lora_decode.json" 2>&1 | grep "batch-1"
elif [ "$MODE" = final ]; then
    # the session's last call: the JSON schema at batch 256 after deferred
    # detokenization (one decode per request at its end, offline), then W1 over 4
    # adapters + base with the dense LoRA path from 128 tokens (its boolean mask)
    (cd benchmarks && py 170 structured_e2e_gpu.py --model ../.gpu/qwen3 --num-seqs 256 \
        --runs 2 --out "$OUT/structured_e2e.json" > "$OUT/structured_e2e.log" 2>&1)
    grep '"added\|Error' "$OUT/structured_e2e.log" | tail -6
    py 170 benchmarks/lora_gpu.py --parts w1 --w1-configs base,mixed \
        --out "$OUT/lora_w1_final.json" 2>&1 | grep "^W1"
elif [ "$MODE" = mask ]; then
    # the final call's W1 over adapters had 52 ms prefill steps (32 in the second call):
    # the same W1 with the dense path's mask back in h's dtype (not boolean)
    py 180 benchmarks/lora_gpu.py --parts w1 --w1-configs mixed,base \
        --out "$OUT/lora_w1_mask.json" 2>&1 | grep "^W1"
else
    (cd benchmarks && py 300 structured_e2e_gpu.py --model ../.gpu/qwen3 --num-seqs 256 \
        --runs 3 --out "$OUT/structured_e2e.json" > "$OUT/structured_e2e.log" 2>&1)
    grep '"added\|Error' "$OUT/structured_e2e.log" | tail -6
fi
