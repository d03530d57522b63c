#!/usr/bin/env bash
# Install the tree on the GPU machine (no network: wheels in .whl/, our packages built
# locally) and run the GPU suite.
# .whl/ holds cp312 wheels of what the machine lacks: fastapi, starlette, pydantic(-core),
# annotated-types, typing-inspection, uvicorn, opentelemetry-api, outlines-core, jsonschema
# (+ jsonschema-specifications, referencing, rpds-py, attrs) and, optionally, py-spy.
# Usage (device call, repository root): bash benchmarks/run_on_device.sh PARTS [NUM_PROMPTS]
set -uo pipefail
PARTS="${1:-correctness,hf,w1,w2,w3,w4,prefix,llama8b,masks,quant}"
NUM_PROMPTS="${2:-1024}"
source benchmarks/device_install.sh
nvidia-smi --query-gpu=name,memory.total,memory.used,clocks.sm --format=csv
# The device returns at most 8 files: the summary (rewritten after each part) and the
# console log go to $OUT directly, everything else as one archive. The suite stops at
# SUITE_TIMEOUT seconds (default 540) so the archive is still written within a 600 s call.
timeout "${SUITE_TIMEOUT:-540}" python3 benchmarks/gpu_suite.py --out /tmp/suite \
    --tokenizer-dir .gpu/tokenizer --parts "$PARTS" --num-prompts "$NUM_PROMPTS" \
    --summary "$OUT/suite.json" 2>&1 | tee "$OUT/console.log"
status=${PIPESTATUS[0]}
tar czf "$OUT/suite.tar.gz" --exclude=models -C /tmp suite
exit "$status"
