# Sourced by the device scripts (repository root, on the GPU machine, no network): installs
# the carried wheels (.whl/: fastapi and the rest the machine lacks, cp312) into /tmp/site
# and this tree's packages into /tmp/site2, both with --upgrade (a warm machine keeps the
# previous call's packages otherwise), puts them on PYTHONPATH, and defines py SECONDS ARGS
# (python3 under a timeout) and w2 NAME [ARGS] (W2 into $OUT/w2_NAME.*, the .gpu/qwen3 folder).
# A failed install ends the calling script.
# The card's name is printed and BW set to its copy rate in GB/s (H100 3350, else 4100).
GPU_NAME=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)
echo "$GPU_NAME"
case "$GPU_NAME" in *H100*) BW=3350 ;; *) BW=4100 ;; esac
export NCCL_NVLS_ENABLE=0 PYTHONUNBUFFERED=1 ENGINE_COMMIT="${ENGINE_COMMIT:-}"
python3 -m pip install -q --upgrade --no-index --no-deps --no-compile --target /tmp/site \
    .whl/*.whl || exit 1
python3 -m pip install -q --upgrade --no-index --no-deps --no-build-isolation --target /tmp/site2 \
    ./sdk ./core ./plugins/reference ./plugins/qwen3 ./plugins/llama ./plugins/triton \
    ./plugins/fp8 ./plugins/awq ./plugins/outlines ./plugins/moe 2>&1 | tail -2
[ "${PIPESTATUS[0]}" -eq 0 ] || exit 1
export PYTHONPATH=/tmp/site2:/tmp/site PATH="/tmp/site/bin:$PATH"  # py-spy, when carried
py() { local s=$1; shift; timeout "$s" python3 "$@"; }
w2() {  # w2 NAME [engine args]: batch-1 decode of the 0.6B shape, ms per output token
    local name=$1; shift
    py 150 -m engine.cli.main bench latency --model .gpu/qwen3 --load-format dummy \
        --dtype bfloat16 --batch-size 1 --input-len 128 --output-len 256 --num-iters 3 \
        --num-iters-warmup 1 --max-num-seqs 1 "$@" --save-result "$OUT/w2_$name.json" \
        > "$OUT/w2_$name.log" 2>&1
    grep -m3 "ms_per_output_token\|Error\|error:" "$OUT/w2_$name.log" | sed "s/^/$name: /"
}
