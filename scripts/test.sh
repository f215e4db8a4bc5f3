#!/usr/bin/env bash
# Set up .venv (scripts/setup.sh) and chromium, then lint and run the whole test suite (which builds
# the docs with `mkdocs build --strict`: tests/test_docs.py) on two pytest-xdist workers, a test file
# per worker at a time (its module fixtures built once).
#   RACE_TEST_WORKERS=N   xdist workers (default 2; 0: one process, no xdist)
# Extra arguments go to pytest.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
VENV=${RACE_VENV:-.venv}
# The report's browser tests drive Debian's chromium through Playwright (never `playwright install`):
# installed from the package registry when it is missing.
if [ ! -x /usr/bin/chromium ]; then
  SUDO=""; [ "$(id -u)" = "0" ] || SUDO="sudo"
  export DEBIAN_FRONTEND=noninteractive
  $SUDO apt-get install -y -q chromium >/dev/null 2>&1 \
    || { $SUDO apt-get update -q >/dev/null && $SUDO apt-get install -y -q chromium >/dev/null; } \
    || { echo "could not install chromium (apt-get install chromium) for the browser tests" >&2; exit 1; }
fi
export PREFECT_SERVER_ANALYTICS_ENABLED=false PREFECT_HOME="${PREFECT_HOME:-$PWD/.race/prefect-test}" \
  TOKENIZERS_PARALLELISM=false HF_HUB_OFFLINE=1
mkdir -p "$PREFECT_HOME"  # Prefect creates only the last level of it (warns on a fresh clone)
"$VENV/bin/ruff" check .
WORKERS=${RACE_TEST_WORKERS:-2}
PARALLEL=(); [ "$WORKERS" = "0" ] || PARALLEL=(-n "$WORKERS" --dist loadfile)
# the slowest tests are listed at the end: where the suite's time goes, on every CI run
"$VENV/bin/python" -m pytest -q -p no:cacheprovider --durations=25 "${PARALLEL[@]}" "$@"
