# Sourced by the device scripts (repository root, on the GPU machine, no network): installs
# the carried wheels (.whl/: fastapi and the rest the machine lacks, cp312) into /tmp/site
# and this tree's packages into /tmp/site2, both with --upgrade (a warm machine keeps the
# previous call's packages otherwise), puts them on PYTHONPATH, and defines py SECONDS ARGS
# (python3 under a timeout). A failed install ends the calling script.
export NCCL_NVLS_ENABLE=0 PYTHONUNBUFFERED=1 ENGINE_COMMIT="${ENGINE_COMMIT:-}"
python3 -m pip install -q --upgrade --no-index --no-deps --no-compile --target /tmp/site \
    .whl/*.whl || exit 1
python3 -m pip install -q --upgrade --no-index --no-deps --no-build-isolation --target /tmp/site2 \
    ./sdk ./core ./plugins/reference ./plugins/qwen3 ./plugins/llama ./plugins/triton \
    ./plugins/fp8 ./plugins/awq ./plugins/outlines ./plugins/moe 2>&1 | tail -2
[ "${PIPESTATUS[0]}" -eq 0 ] || exit 1
export PYTHONPATH=/tmp/site2:/tmp/site PATH="/tmp/site/bin:$PATH"  # py-spy, when carried
py() { local s=$1; shift; timeout "$s" python3 "$@"; }
