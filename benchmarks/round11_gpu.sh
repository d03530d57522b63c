#!/usr/bin/env bash
# Device calls of 2026-12-06, second session (round 11). Three calls on one warm machine,
# each within 30 s of the previous one (the vLLM anchor's chunks go over in two of them).
# The vLLM archive (../shared/vllm-anchor/pack.sh) is re-split here into two folders that
# each fit one call with the working tree: .whl-vllm/a (chunk 00) and .whl-vllm/b (chunk
# 01 and SHA256SUMS); .carry/setup.sh is a copy of the anchor's setup.sh. The committed
# tree travels as .gpu/clean.tgz:
#   git archive --format=tar.gz HEAD sdk core plugins benchmarks tests > .gpu/clean.tgz
#   call 1, carry .whl-vllm/a:
#       mkdir -p $HOME/vparts && mv .whl-vllm/a/* $HOME/vparts/ && bash benchmarks/round11_gpu.sh part1
#   call 2, carry .whl-vllm/b .whl .carry .gpu/clean.tgz:
#       mkdir -p /tmp/c && tar -xzf .gpu/clean.tgz -C /tmp/c && cp -r .whl .whl-vllm .carry /tmp/c/ \
#       && cd /tmp/c && bash benchmarks/round11_gpu.sh sbs
#   call 3 (optional, while vLLM is still unpacked there), carry .whl .gpu/clean.tgz:
#       mkdir -p /tmp/c && tar -xzf .gpu/clean.tgz -C /tmp/c && cp -r .whl /tmp/c/ \
#       && cd /tmp/c && bash benchmarks/round11_gpu.sh quant
#   call 4, carry .whl .gpu:
#       mkdir -p /tmp/c && tar -xzf .gpu/clean.tgz -C /tmp/c && cp -r .whl .gpu /tmp/c/ \
#       && cd /tmp/c && bash benchmarks/round11_gpu.sh engine
# Modes:
#   part1   the sampler's GPU tests from the source tree (no wheels carried in this call)
#   sbs     vLLM 0.26 unpacked; Engine and vLLM in this call (side_by_side.py): W4, W2,
#           the Llama-8B shape at batch 1, W1; each part writes its row as it ends
#   quant   the same for FP8 (both --quantization fp8) and AWQ (an AutoAWQ-config copy of
#           the folder, dummy weights): the 8B shape and W2, issue 23's same-run table
#   lora    (call 5, after the two LoRA kernel changes; carry .whl .gpu) the LoRA GPU tests,
#           then batch-1 decode with an adapter and W1 over 4 adapters, two W1 runs each
#           (the first may compile; the second is the figure)
#   engine  Engine only: the masked row sampler's GPU tests, LoRA batch-1 decode and W1
#           over 4 adapters with a kernel table of each run (lora_gpu.py --profile), then
#           the JSON schema at batch 256 with the masked row sampler against its pipeline
set -uo pipefail
MODE="${1:?part1, sbs, quant, lora or engine}"
if [ "$MODE" = part1 ]; then
    ls -la "$HOME/vparts"
    PYTHONPATH=sdk:core:tests/fused timeout 150 python3 -m pytest -q -p no:cacheprovider \
        --noconftest tests/fused/test_row_sampler.py tests/fused/test_masked_row_sampler.py \
        2>&1 | tail -6
    exit 0
fi
if [ "$MODE" = sbs ]; then
    mkdir -p "$HOME/vparts"
    mv .whl-vllm/b/* "$HOME/vparts/" 2>/dev/null
    bash .carry/setup.sh || exit 1
fi
source benchmarks/device_install.sh
nvidia-smi --query-gpu=name --format=csv,noheader
if [ "$MODE" = sbs ]; then
    py 545 benchmarks/side_by_side.py --parts "${SBS_PARTS:-w4,w2,llama8b,w1}" --model "$HOME/v/model" \
        --out "$OUT/sbs_round11.json" 2>&1 | grep -v "^\$ \|^  exit" | tail -12
    tar -czf "$OUT/sbs_logs.tgz" -C /tmp/sbs $(cd /tmp/sbs && ls *.log) 2>/dev/null; ls "$OUT"
elif [ "$MODE" = quant ]; then
    [ -f "$HOME/v/.ok" ] || { echo "vLLM is not unpacked on this machine"; exit 1; }
    py "${QUANT_SECONDS:-545}" benchmarks/side_by_side.py \
        --parts "${QUANT_PARTS:-llama8b_fp8,llama8b_awq,w2_fp8,w2_awq}" \
        --model "$HOME/v/model" --out "$OUT/sbs_quant_round11.json" 2>&1 \
        | grep -v "^\$ \|^  exit" | tail -12
    # Engine only, after vLLM's parts (issue 23's "quantized W2 <= bf16 W2, same run")
    [ -z "${QUANT_ENGINE_PARTS:-}" ] || py 200 benchmarks/side_by_side.py --engine-only \
        --parts "$QUANT_ENGINE_PARTS" --model "$HOME/v/model" \
        --out "$OUT/sbs_quant_engine.json" 2>&1 | grep -v "^\$ \|^  exit" | tail -6
    tar -czf "$OUT/sbs_quant_logs.tgz" -C /tmp/sbs $(cd /tmp/sbs && ls *.log) 2>/dev/null
elif [ "$MODE" = lora ]; then
    py 150 -m pytest -q -p no:cacheprovider tests/fused/test_lora_kernels.py \
        tests/fused/test_lora_merged_expand.py tests/fused/test_lora_gemv_epilogue.py \
        tests/fused/test_lora_shrink_parts.py tests/lora/test_lora_cuda.py -k "not inside" \
        2>&1 | tail -4
    py 330 benchmarks/lora_gpu.py --quick --parts "${LORA_PARTS:-decode,w1}" --decode-runs base,adapter \
        --w1-runs 2 --out "$OUT/lora_round11.json" 2>&1 | grep -v "^\\$" | tail -12
else
    py 120 -m pytest -q -p no:cacheprovider tests/fused/test_row_sampler.py \
        tests/fused/test_masked_row_sampler.py tests/lora/test_lora_cuda.py 2>&1 | tail -4
    py 300 benchmarks/lora_gpu.py --quick --parts decode,w1 --decode-runs base,adapter \
        --profile --out "$OUT/lora_profile.json" 2>&1 | grep -v "^\\$" | tail -60
    (cd benchmarks && py 200 structured_e2e_gpu.py --model ../.gpu/qwen3 --num-seqs 256 --profile \
        --runs 2 --ab-masked-row-sampler --out "$OUT/structured_ab.json" \
        > "$OUT/structured_ab.log" 2>&1)
    grep '"added\|Error' "$OUT/structured_ab.log" | tail -8
fi
