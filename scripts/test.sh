#!/usr/bin/env bash
# The test command. Sets up .venv (dev profile: scripts/setup.sh), then lint (ruff), types (mypy), the
# import contracts (lint-imports), the tests.
#
#   bash scripts/test.sh              everything, as CI runs it (<= 15 min on a 2-core machine from a clean
#                                     clone, installs included): two pytest lanes, one after the other,
#                                       parallel  pytest -n $TEST_WORKERS --dist worksteal -m "not serial"
#                                       serial    pytest -m serial   (the Ray and browser tests: one Ray
#                                                 instance per process and Playwright's event loop, so
#                                                 they run in one process, in conftest.py's order)
#   bash scripts/test.sh --quick      the edit loop (<= 3 min): the same checks and the unit tests, those
#                                     conftest.py marks `quick` (not slow, not serial), on xdist workers,
#                                     Hypothesis's `quick` profile (<= 15 examples a property). Measured
#                                     (pytest alone, issue 35): 2 min 1 s of CPU for ~1,200 tests; 5 min 22 s
#                                     of wall time on 2 cores that other runs loaded (load average 7-9)
#   bash scripts/test.sh [--quick] PYTEST_ARGS...
#                                     extra pytest arguments for every lane, e.g. -x, -k expr, a file:
#                                     a lane that then selects no test passes
#
# TEST_WORKERS (default 3): the parallel lane's xdist workers. The tests mostly wait on the processes
# they start, so one more worker than this machine's 2 cores pays (measured on 2 cores: -n 2 9m07,
# -n 3 8m15, -n 4 8m55 for the parallel lane).
# Every test fails if it leaves a process behind (per worker); a timed-out test fails in its own worker
# (timeout_method = "signal") and a crashed worker is not replaced (--max-worker-restart=0).
set -euo pipefail
cd "$(dirname "$0")/.."
quick=0
if [ "${1:-}" = "--quick" ]; then
  quick=1
  shift
fi
bash scripts/setup.sh dev
# pytest caches each test module's rewritten bytecode (and Python that of trainforge, for every worker
# and server process the tests start): without it a collection takes twice as long.
unset PYTHONDONTWRITEBYTECODE
.venv/bin/ruff check trainforge tests examples bench
.venv/bin/mypy
.venv/bin/lint-imports  # the import contracts: [tool.importlinter] in pyproject.toml
workers="${TEST_WORKERS:-3}"
# pytest's exit code 5 ("no tests collected") is a pass: an argument may select nothing in one lane.
lane() { "$@" || { code=$?; [ "$code" = 5 ] && return 0; return "$code"; }; }
pytest=(.venv/bin/python -m pytest -ra --max-worker-restart=0)
# Hypothesis: a few examples a property in the edit loop, each property's full count in CI's lanes
# (tests/hypothesis_profiles.py).
if [ "$quick" = 1 ]; then
  HYPOTHESIS_PROFILE=quick lane "${pytest[@]}" -q -n 2 --dist worksteal -m quick "$@"
  exit 0
fi
export HYPOTHESIS_PROFILE=thorough
# The lanes run one after the other: the serial lane's Ray tests fail on their timeouts when the
# parallel lane keeps the CPUs busy beside them (measured: nice did not save them). `timeout` ends a
# lane that hangs past any test's timeout.
status=0
lane timeout -k 30 1500 "${pytest[@]}" -n "$workers" --dist worksteal -m "not serial" "$@" || status=$?
serial_status=0
lane timeout -k 30 1500 "${pytest[@]}" -m serial "$@" || serial_status=$?
if [ "$status" != 0 ] || [ "$serial_status" != 0 ]; then
  echo "test.sh: parallel lane (-m 'not serial') exit $status, serial lane (-m serial) exit $serial_status" >&2
  exit 1
fi
