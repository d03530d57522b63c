#!/usr/bin/env bash
# The project's test command: lint, format check, type check (strict on the SDK), tests.
# Runs with the venv at $VENV (default .venv); extra arguments go to pytest.
# pytest runs the files over $PYTEST_WORKERS processes (pytest-xdist; default: the CPU
# count, at most 4; 0 runs everything in this process), one file to a process so that a
# module's server or model fixture is built once.
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
WORKERS="${PYTEST_WORKERS:-$(python -c 'import os; print(min(4, len(os.sched_getaffinity(0))))')}"
pytest -m "not gpu" -p no:cacheprovider -n "$WORKERS" --dist loadfile "$@"
