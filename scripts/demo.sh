#!/usr/bin/env bash
# Set up .venv (scripts/setup.sh), then run the demo on its embedded defaults.
set -euo pipefail
cd "$(dirname "$0")/.."
RACE_VLLM=${RACE_VLLM:-0} bash scripts/setup.sh
# Prefect state (the temporary server's database) stays in the project unless PREFECT_HOME is set:
# a ~/.prefect database migrated by a newer Prefect elsewhere stops this one's server from starting.
export PREFECT_HOME="${PREFECT_HOME:-$PWD/.race/prefect}"
mkdir -p "$PREFECT_HOME"
export PREFECT_SERVER_ANALYTICS_ENABLED=false TOKENIZERS_PARALLELISM=false HF_HUB_OFFLINE=1
exec "${RACE_VENV:-.venv}/bin/race" demo "$@"
