#!/usr/bin/env bash
# Set up .venv (dev profile) and run the linter (ruff), the type checker (mypy) and the whole test
# suite (slow tests included).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh dev
.venv/bin/ruff check trainforge tests examples bench
.venv/bin/mypy
exec .venv/bin/python -m pytest -ra "$@"
