#!/usr/bin/env bash
# Device calls planned on 2026-12-05 (round 8), Engine only; each mode is one call, carrying
# .whl and .gpu (.gpu/qwen3: the Qwen3-0.6B-shaped folder; .gpu/triton_old_kernels.py: the
# Triton attention kernels before the masked/unmasked tile split, from `git show
# 3128126:plugins/triton/engine_triton/kernels.py`). Writes under $OUT.
#   bash benchmarks/round8_gpu.sh attention   prefill tile sweep and before/after (attention_
#                                             prefill_sweep_gpu.py), then W2 with and without
#                                             ENGINE_TORCH_COMPILE=1 (issue 14 item 2)
#   bash benchmarks/round8_gpu.sh lora        multi-LoRA (lora_gpu.py: kernels, batch-1 decode
#                                             with an adapter, W1 over 4 adapters), then the
#                                             0.6B decode profiles of bf16 / FP8 / AWQ
#   bash benchmarks/round8_gpu.sh fp8rows     W2 of the 0.6B shape with FP8 (the tuned table
#                                             as committed), the FP8 GEMV sweep with the bf16
#                                             GEMV's few-rows tiles (quant_gemv_gpu.py, 1
#                                             token), its winners merged into the tree's
#                                             table, then W2 with FP8 again and with bf16
#   bash benchmarks/round8_gpu.sh final       W2 with FP8 (the merged table, fp8_norm rows for
#                                             the add+RMSNorm launches) and bf16, the attention
#                                             sweep again (heaviest query blocks first, decode
#                                             with one masked loop), W2 with torch.compile
#   bash benchmarks/round8_gpu.sh w3          W3 served at c=256 (TPOT p99 against p50)
set -uo pipefail
MODE="${1:?attention, lora, fp8rows, final or w3}"
source benchmarks/device_install.sh
nvidia-smi --query-gpu=name --format=csv,noheader
if [ "$MODE" = attention ]; then
    py 260 benchmarks/attention_prefill_sweep_gpu.py --old-kernels .gpu/triton_old_kernels.py \
        --out "$OUT/attention_prefill.json" 2>&1 | tail -40
    w2 compile0
    ENGINE_TORCH_COMPILE=1 w2 compile1
elif [ "$MODE" = lora ]; then
    py 250 benchmarks/lora_gpu.py --quick --parts kernels,decode,w1 --out "$OUT/lora_gpu.json" \
        2>&1 | tail -26
    bash benchmarks/round6_profile_gpu.sh .gpu/qwen3 qwen06b 32 2>&1 | grep -v "^Looking\|^Processing" \
        | grep -A12 "^===" | head -60
elif [ "$MODE" = final ]; then
    w2 fp8 --quantization fp8
    w2 bf16
    py 200 benchmarks/attention_prefill_sweep_gpu.py --old-kernels .gpu/triton_old_kernels.py \
        --out "$OUT/attention_prefill.json" 2>&1 | tail -30
    ENGINE_TORCH_COMPILE=1 w2 compile1
    grep -B2 -A8 -m1 "Traceback\|Error" "$OUT/w2_compile1.log" | tail -14
elif [ "$MODE" = fp8rows ]; then
    w2 fp8_before --quantization fp8
    py 200 benchmarks/quant_gemv_gpu.py --models Qwen3-0.6B --tokens 1 --sweep-tokens 1 \
        --sweep-s 100 --write-tuned "$OUT/tuned" --out "$OUT/quant_gemv_06b.json" 2>&1 \
        | grep -A12 "== sweep"
    python3 - "$OUT/tuned/engine_fp8" plugins/fp8/engine_fp8/tuned <<'PY'
import json, sys
from pathlib import Path
new_dir, tree = Path(sys.argv[1]), Path(sys.argv[2])
for new in new_dir.glob("*.json"):
    old = tree / new.name
    table = json.loads(old.read_text()) if old.exists() else json.loads(new.read_text())
    found = json.loads(new.read_text())["configs"]
    table["configs"].update(found)
    old.write_text(json.dumps(table, indent=1) + "\n")
    print("merged", len(found), "tiles into", old, found)
PY
    cp plugins/fp8/engine_fp8/tuned/*.json "$OUT/" 2>/dev/null
    source benchmarks/device_install.sh
    w2 fp8_after --quantization fp8
    w2 bf16
else
    py 400 benchmarks/serve_side_by_side.py --parts w3 --engine-only --model "$(realpath .gpu/qwen3)" \
        --loads 256:1024 --out "$OUT/w3_tpot.json" 2>&1 | tail -8
fi
