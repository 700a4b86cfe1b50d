#!/usr/bin/env bash
# Create .venv (if missing) and install the pinned dev requirements into it. Idempotent and quick
# when nothing changed. torch==2.13.0 (CPU) is installed first so pip never pulls a CUDA build.
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON="${PYTHON:-python3}"
if [ ! -x .venv/bin/python ]; then
  echo "setup: creating .venv with $($PYTHON --version)"
  "$PYTHON" -m venv .venv
fi
stamp=.venv/.trainforge-installed
want="$(cat requirements-dev.txt pyproject.toml | sha256sum | cut -d' ' -f1)"
if [ ! -f "$stamp" ] || [ "$(cat "$stamp")" != "$want" ]; then
  echo "setup: installing torch==2.13.0 (CPU) and trainforge[dev] into .venv"
  .venv/bin/python -m pip install --quiet --disable-pip-version-check "torch==2.13.0"
  .venv/bin/python -m pip install --quiet --disable-pip-version-check -r requirements-dev.txt
  echo "$want" > "$stamp"
fi
