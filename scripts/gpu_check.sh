#!/usr/bin/env bash
# The one command a lent GPU machine runs, from the repository root, in about 6 minutes (8 at most):
#   bash scripts/gpu_check.sh OUTDIR [--dry-run]
# 1. prints the GPU (nvidia-smi), the driver, Python, torch, CUDA and NCCL versions;
# 2. installs the carried wheels (.whl/, from scripts/gpu_wheels.sh) into /tmp/site, puts it on
#    PYTHONPATH and checks every requirement of theirs is met;
# 3. runs tests/gpu/ (pytest, a per-test timeout, a JUnit XML);
# 4. runs the GPU benchmark in its short mode (bench/bench_gpu.py --quick, under 2 minutes);
# 5. writes OUTDIR/gpu_check.json and OUTDIR/gpu_check.md (the summary; docs/gpu.md takes its row),
#    beside gpu_check.log (everything printed), gpu_env.json, gpu_wheels.json, gpu_tests.xml and
#    gpu_bench.json: 7 files, all in OUTDIR itself (the device tool returns 8 files at most).
# --dry-run does what needs no GPU: checks the environment and the wheels (.whl/ if present, else
# the list against this environment), lists the tests it would run and runs the benchmark's no-GPU
# path; it exits 0 on a machine without a GPU when those checks pass.
# trainforge runs from the working tree (PYTHONPATH=$PWD). Python: $PYTHON if set, else .venv/bin/python
# if present, else python3 (the GPU image's Python 3.12, with torch). Exit status: 0 when every test
# passed and the benchmark ran (dry run: when the checks passed), else 1; 2 for a usage error.
# Set GPU_CHECK_COMMIT to the commit under test where the machine has no git (the summary records it).
set -uo pipefail
cd "$(dirname "$0")/.."

usage() { echo "usage: bash scripts/gpu_check.sh OUTDIR [--dry-run]" >&2; exit 2; }
OUT="" DRY=0
for arg in "$@"; do
  case "$arg" in
    --dry-run) DRY=1 ;;
    -h|--help) sed -n '2,20p' "$0"; exit 0 ;;
    -*) usage ;;
    *) [ -z "$OUT" ] || usage; OUT="$arg" ;;
  esac
done
[ -n "$OUT" ] || usage
mkdir -p "$OUT" || exit 2
OUT="$(cd "$OUT" && pwd)"
if [ -n "${PYTHON:-}" ]; then PY="$PYTHON"; elif [ -x .venv/bin/python ]; then PY=.venv/bin/python; else PY=python3; fi
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
rm -f "$OUT"/gpu_check.json "$OUT"/gpu_check.md "$OUT"/gpu_env.json "$OUT"/gpu_wheels.json "$OUT"/gpu_tests.xml \
  "$OUT"/gpu_bench.json
exec > >(tee "$OUT/gpu_check.log") 2>&1
TEE=$!
T0=$SECONDS
step() { echo; echo "== [$((SECONDS - T0))s] $*"; }
# Per-step limits (seconds) that keep the whole run under 8 minutes.
TESTS_LIMIT=${GPU_CHECK_TESTS_LIMIT:-330} TEST_TIMEOUT=${GPU_CHECK_TEST_TIMEOUT:-150} BENCH_LIMIT=${GPU_CHECK_BENCH_LIMIT:-110}
failed=0

step "the GPU ($([ $DRY = 1 ] && echo 'dry run; ')Python: $PY)"
if command -v nvidia-smi >/dev/null; then nvidia-smi || echo "nvidia-smi failed"; else echo "nvidia-smi: not found"; fi

step "wheels (.whl/ -> /tmp/site)"
if compgen -G ".whl/*.whl" >/dev/null; then
  if [ $DRY = 1 ]; then
    echo "would run: $PY -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl"
    "$PY" scripts/gpu_check.py wheels "$OUT/gpu_wheels.json" || failed=1
  elif "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl; then
    export PYTHONPATH="/tmp/site:$PYTHONPATH"
    "$PY" scripts/gpu_check.py wheels "$OUT/gpu_wheels.json" --installed || failed=1
  else
    echo "the wheels did not install: the server and serve tests will fail"; failed=1
  fi
else
  echo "no .whl/: the server and serve tests need fastapi and uvicorn, which the GPU image lacks."
  echo "Run 'bash scripts/gpu_wheels.sh' on a machine with PyPI and carry .whl (device tool: carry=[\".whl\"])."
  "$PY" scripts/gpu_check.py wheels "$OUT/gpu_wheels.json" || failed=1
fi

step "environment: Python, torch, CUDA, NCCL, packages"
"$PY" scripts/gpu_check.py env "$OUT/gpu_env.json" || { echo "cannot describe the environment"; failed=1; }

PYTEST=("$PY" -m pytest tests/gpu -p no:cacheprovider)
if [ $DRY = 1 ]; then
  step "tests/gpu/ (dry run: the tests it would run)"
  echo "would run: timeout $TESTS_LIMIT ${PYTEST[*]} -ra -v --timeout=$TEST_TIMEOUT --junitxml=$OUT/gpu_tests.xml"
  "${PYTEST[@]}" --collect-only -q || failed=1
  step "benchmark (dry run: its no-GPU path)"
  echo "would run: timeout $BENCH_LIMIT $PY bench/bench_gpu.py --quick --require-gpu --json-out $OUT/gpu_bench.json"
  CUDA_VISIBLE_DEVICES="" "$PY" bench/bench_gpu.py --quick --json-out "$OUT/gpu_bench.json" || failed=1
else
  step "tests/gpu/ (each test at most ${TEST_TIMEOUT}s, all at most ${TESTS_LIMIT}s)"
  timeout -k 10 "$TESTS_LIMIT" "${PYTEST[@]}" -ra -v --timeout="$TEST_TIMEOUT" --junitxml="$OUT/gpu_tests.xml" || failed=1
  step "benchmark: bench/bench_gpu.py --quick (at most ${BENCH_LIMIT}s)"
  timeout -k 10 "$BENCH_LIMIT" "$PY" bench/bench_gpu.py --quick --require-gpu --timeout 60 --json-out "$OUT/gpu_bench.json" \
    || failed=1
fi

step "summary"
"$PY" scripts/gpu_check.py summary "$OUT" $([ $DRY = 1 ] && echo --dry-run) || failed=1
echo "== done in $((SECONDS - T0))s: $([ $failed = 0 ] && echo OK || echo 'NOT OK (see above)'); files in $OUT: $(cd "$OUT" && ls | tr '\n' ' ')"
exec >&- 2>&-
wait "$TEE"  # the log is whole before the device tool collects OUTDIR
exit $failed
