#!/usr/bin/env bash
# Set up .venv (scripts/setup.sh), then lint and run the whole test suite.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
VENV=${RACE_VENV:-.venv}
export PREFECT_SERVER_ANALYTICS_ENABLED=false PREFECT_HOME="${PREFECT_HOME:-$PWD/.race/prefect-test}" \
  TOKENIZERS_PARALLELISM=false HF_HUB_OFFLINE=1
mkdir -p "$PREFECT_HOME"  # Prefect creates only the last level of it (warns on a fresh clone)
"$VENV/bin/ruff" check .
"$VENV/bin/python" -m pytest -q -p no:cacheprovider "$@"
