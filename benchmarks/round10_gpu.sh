#!/usr/bin/env bash
# Device calls of 2026-12-06 (round 10). Round 9's kernels had not run on a GPU yet, so
# `check` runs their GPU tests first. Engine only; each mode is one call carrying .whl and
# .gpu (.gpu/qwen3: the Qwen3-0.6B-shaped folder with the Qwen3 tokenizer). Run the
# committed tree:
#   git archive --format=tar.gz HEAD sdk core plugins benchmarks tests > .gpu/clean.tgz
#   command: mkdir -p /tmp/c && tar -xzf .gpu/clean.tgz -C /tmp/c && cp -r .whl .gpu /tmp/c/ \
#            && cd /tmp/c && bash benchmarks/round10_gpu.sh MODE
# Modes:
#   check    GPU tests of rounds 9 and 10 (split merge in the attention launch, fused q/k/v
#            + KV-cache write, LoRA epilogue loads, sampling in the decode graph, the gated
#            gate/up GEMV), the shrink-in-GEMV test alone under a short timeout, then W2
#            (batch 1, ms per output token; temperature 1.0 as vllm bench latency) with
#            each launch saving off in turn, greedy, and the LM head on the GEMV
#            (ENGINE_GEMV_LM_HEAD=1, off by default until measured)
#   more     check's tests without -x (a CPU-only test had stopped them), LoRA batch-1
#            decode (lora_gpu.py --quick) with and without the shrink inside the GEMV, and
#            what a JSON schema costs at batch 256 (structured_e2e_gpu.py)
#   (W2 and the 8B shape side by side, and W1 over 4 adapters: round9_gpu.sh decode)
#   serve    the schema at batch 256 with the sampler's one-launch masked path against its
#            pipeline (ENGINE_MASKED_ROW_SAMPLER=0), a kernel profile of the schema run and
#            its unconstrained twin (device-busy time against wall time), then W2 with
#            ENGINE_TORCH_COMPILE=1 against 0
set -uo pipefail
MODE="${1:?check, more or serve}"
source benchmarks/device_install.sh
nvidia-smi --query-gpu=name --format=csv,noheader
if [ "$MODE" = check ]; then
    py 300 -m pytest -q -x -p no:cacheprovider plugins/triton/tests \
        tests/fused tests/lora/test_lora_cuda.py tests/model/test_decode_graph_cuda.py \
        -k "not inside and not compile_sm90" 2>&1 | tail -8
    ENGINE_GEMV_LM_HEAD=1 py 120 -m pytest -q -x -p no:cacheprovider \
        tests/model/test_decode_graph_cuda.py tests/fused/test_gemv.py 2>&1 | tail -3
    py 60 -m pytest -q -x -p no:cacheprovider tests/fused/test_lora_gemv_epilogue.py \
        -k inside 2>&1 | tail -3
    w2 base
    w2 greedy --temperature 0
    ENGINE_FUSED_SILU=0 w2 silu_apart
    ENGINE_GEMV_LM_HEAD=1 w2 lm_head_gemv
    ENGINE_TRITON_SPLIT_MERGE=0 w2 two_launch_merge
    ENGINE_FUSED_KV_STORE=0 w2 backend_store
    ENGINE_FUSED_SILU=0 ENGINE_TRITON_SPLIT_MERGE=0 ENGINE_FUSED_KV_STORE=0 w2 round8_launches
    w2 base_again
elif [ "$MODE" = more ]; then  # the second call: check's tests without -x, LoRA, schema
    py 200 -m pytest -q -p no:cacheprovider plugins/triton/tests tests/fused \
        tests/lora/test_lora_cuda.py tests/model/test_decode_graph_cuda.py \
        -k "not inside and not compile_sm90" 2>&1 | tail -6
    py 130 benchmarks/lora_gpu.py --quick --parts decode --out "$OUT/lora_gpu.json" \
        2>&1 | grep -i "decode\|error" | tail -6
    ENGINE_LORA_SHRINK_IN_GEMV=1 py 70 benchmarks/lora_gpu.py --quick --parts decode \
        --decode-runs adapter --out "$OUT/lora_gpu_shrink_in_gemv.json" 2>&1 | grep -i "decode\|error" | tail -6
    (cd benchmarks && py 120 structured_e2e_gpu.py --model ../.gpu/qwen3 --num-seqs 256 \
        --runs 2 --out "$OUT/structured_e2e.json" > "$OUT/structured_e2e.log" 2>&1;
     grep '"added\|"mean\|Error' "$OUT/structured_e2e.log" | tail -6)
else  # serve: where the schema's time goes (device-busy time, top kernels); torch.compile
    (cd benchmarks && py 200 structured_e2e_gpu.py --model ../.gpu/qwen3 --num-seqs 256 \
        --runs 2 --profile --ab-masked-row-sampler --out "$OUT/structured_prof.json" \
        > "$OUT/structured_prof.log" 2>&1)
    grep '"added' "$OUT/structured_prof.log"
    tail -3 "$OUT/structured_prof.log"
    w2 compile0
    ENGINE_TORCH_COMPILE=1 w2 compile1
    grep -B2 -A8 -m1 "Traceback\|Error" "$OUT/w2_compile1.log" | tail -14
fi
