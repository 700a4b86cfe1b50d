#!/usr/bin/env bash
# Download into .whl/ (ignored by git) the wheels scripts/gpu_wheels.txt lists: what trainforge's GPU
# checks need beyond the lent GPU machine's image, for its Python (CPython 3.12, x86-64 Linux), which
# has no package index. The folder is replaced whole (one version of each), then checked
# (scripts/gpu_check.py wheels). A device run names `.whl` in `carry`; scripts/gpu_check.sh installs it.
#   bash scripts/gpu_wheels.sh
set -euo pipefail
cd "$(dirname "$0")/.."
if [ -n "${PYTHON:-}" ]; then PY="$PYTHON"; elif [ -x .venv/bin/python ]; then PY=.venv/bin/python; else PY=python3; fi
mapfile -t specs < <(sed -e 's/#.*//' -e 's/[[:space:]]//g' scripts/gpu_wheels.txt | grep -v '^$')
rm -rf .whl.partial
mkdir .whl.partial
echo "gpu_wheels: downloading ${#specs[@]} wheels for CPython 3.12 on x86-64 Linux: ${specs[*]}"
"$PY" -m pip download --quiet --disable-pip-version-check --no-deps --only-binary=:all: \
  --python-version 3.12 --implementation cp \
  --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 --platform manylinux_2_17_x86_64 \
  --platform manylinux2014_x86_64 --platform manylinux1_x86_64 \
  -d .whl.partial "${specs[@]}"
rm -rf .whl
mv .whl.partial .whl
ls -1 .whl
echo "gpu_wheels: $(du -sh .whl | cut -f1) in .whl/ (carry it: the device tool's carry=[\".whl\"])"
"$PY" scripts/gpu_check.py wheels -
