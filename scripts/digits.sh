#!/usr/bin/env bash
# Set up .venv and train the digits CNN on 2 local workers (prints metrics and the checkpoint path).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh quickstart
exec .venv/bin/python examples/digits.py --num-workers 2 "$@"
