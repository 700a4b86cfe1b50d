#!/usr/bin/env bash
# Create .venv (if missing) and install what a profile needs into it. Idempotent and quick when
# nothing changed. torch==2.13.0 (CPU) is always installed first so pip never pulls a CUDA build.
#   bash scripts/setup.sh quickstart  torch, the package and scikit-learn (requirements-quickstart.txt):
#                                     what scripts/digits.sh and the examples need
#   bash scripts/setup.sh [dev]       the pinned dev set (requirements-dev.txt): + Ray, moto, s3fs,
#                                     pytest, ruff, mypy, Playwright; what scripts/test.sh (and CI) need.
#                                     Also Debian's chromium (/usr/bin/chromium, which the browser tests
#                                     launch: Playwright's own browser download is never used) and
#                                     bubblewrap (/usr/bin/bwrap: the job sandbox of a server that is not
#                                     root, whose tests run it), with apt-get when run as root; checked on
#                                     every run, stamp or not.
# Each profile has a stamp in .venv (.trainforge-quickstart, .trainforge-installed for dev) holding a
# hash of its requirements and pyproject.toml. dev includes quickstart: after test.sh, digits.sh
# installs nothing; after digits.sh, test.sh installs only the rest.
set -euo pipefail
cd "$(dirname "$0")/.."
profile="${1:-dev}"
case "$profile" in
  quickstart) requirements=requirements-quickstart.txt stamp=.venv/.trainforge-quickstart ;;
  dev) requirements=requirements-dev.txt stamp=.venv/.trainforge-installed ;;
  *) echo "setup: unknown profile '$profile'; use 'quickstart' or 'dev'" >&2; exit 2 ;;
esac
digest() { cat "$1" pyproject.toml | sha256sum | cut -d' ' -f1; }
installed() { [ -f "$2" ] && [ "$(cat "$2")" = "$(digest "$1")" ]; }  # installed REQUIREMENTS STAMP
ensure_debian_packages() {  # chromium (the browser tests), bubblewrap (the job sandbox's userns tests)
  missing=()
  [ -x /usr/bin/chromium ] || missing+=(chromium)
  [ -x /usr/bin/bwrap ] || missing+=(bubblewrap)
  [ "${#missing[@]}" = 0 ] && return 0
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
    echo "setup: installing Debian's ${missing[*]} with apt-get (the browser tests launch /usr/bin/chromium;"\
         "the job sandbox's tests run /usr/bin/bwrap)"
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}" >/dev/null
  else
    echo "setup: missing ${missing[*]}: the browser tests launch Debian's Chromium, the job sandbox's tests" \
         "bubblewrap. On Debian, run:" >&2
    echo "  sudo apt-get update && sudo apt-get install -y ${missing[*]}" >&2
    exit 1
  fi
}
PYTHON="${PYTHON:-python3}"
if [ "$profile" = dev ]; then
  ensure_debian_packages
fi
if [ ! -x .venv/bin/python ]; then
  echo "setup: creating .venv with $($PYTHON --version)"
  "$PYTHON" -m venv .venv
fi
if installed "$requirements" "$stamp" || { [ "$profile" = quickstart ] &&
    installed requirements-dev.txt .venv/.trainforge-installed; }; then
  exit 0
fi
echo "setup: installing torch==2.13.0 (CPU), then $requirements ($profile) into .venv"
.venv/bin/python -m pip install --quiet --disable-pip-version-check "torch==2.13.0"
.venv/bin/python -m pip install --quiet --disable-pip-version-check -r "$requirements"
if [ "$profile" = dev ]; then
  # Keras 2 for trainforge.tensorflow, matching tensorflow-cpu (see requirements-dev.txt for --no-deps).
  .venv/bin/python -m pip install --quiet --disable-pip-version-check --no-deps "tf-keras==2.21.0"
fi
digest "$requirements" > "$stamp"
