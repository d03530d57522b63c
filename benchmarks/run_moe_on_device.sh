#!/usr/bin/env bash
# Install the tree on the GPU machine (as run_on_device.sh: wheels in .whl/, no network) and
# run the MoE kernel tests and benchmarks/moe_gpu.py. Results: $OUT/moe_gpu.json, logs.
# Usage (device call, repository root): bash benchmarks/run_moe_on_device.sh [PARTS]
set -uo pipefail
PARTS="${1:-kernel,decode,w1,share}"
source benchmarks/device_install.sh
nvidia-smi --query-gpu=name,memory.total,memory.used,clocks.sm --format=csv
python3 -m pytest -q -p no:cacheprovider tests/moe plugins/triton/tests 2>&1 | tail -5 \
    | tee "$OUT/moe_kernel_tests.log"
timeout "${SUITE_TIMEOUT:-540}" python3 benchmarks/moe_gpu.py --out /tmp/moe \
    --tokenizer-dir .gpu/tokenizer --parts "$PARTS" 2>&1 | tee "$OUT/moe_console.log"
status=${PIPESTATUS[0]}
cp /tmp/moe/moe_gpu.json "$OUT/" 2>/dev/null
tar czf "$OUT/moe_logs.tar.gz" --exclude=models -C /tmp moe
exit "$status"
