#!/usr/bin/env bash
# The project's test command: lint, format check, type check (strict on the SDK), tests.
# Runs with the venv at $VENV (default .venv); extra arguments go to pytest.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VENV="${VENV:-$ROOT/.venv}"
cd "$ROOT"
export PATH="$VENV/bin:$PATH"

echo "== ruff check"
ruff check .
echo "== ruff format --check"
ruff format --check .
echo "== mypy"
mypy
echo "== pytest"
pytest -m "not gpu" -p no:cacheprovider "$@"
