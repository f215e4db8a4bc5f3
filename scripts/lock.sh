#!/usr/bin/env bash
# Refresh constraints/ci.txt, the exact versions CI installs (scripts/setup.sh under CI=true), from the
# virtual environment the suite was last green in. Run it after a green `RACE_LOCK=0 bash scripts/test.sh`
# (which installs from the ranges in pyproject.toml, as users do), then commit constraints/ci.txt.
#   RACE_VENV=path   the environment to read (default .venv)
set -euo pipefail
cd "$(dirname "$0")/.."
VENV=${RACE_VENV:-.venv}
{
  echo "# The versions the suite was last green with: scripts/setup.sh installs exactly these under CI=true"
  echo "# (RACE_LOCK=0: the ranges of pyproject.toml instead). Refresh: bash scripts/lock.sh (after a green"
  echo "# RACE_LOCK=0 bash scripts/test.sh). $("$VENV/bin/python" -c 'import platform; print("Python", platform.python_version())')"
  # local version labels (torch's +cpu) dropped: a GPU user's CUDA build of the same release satisfies them too
  "$VENV/bin/python" -m pip freeze --all --exclude-editable --disable-pip-version-check 2>/dev/null | sed -E 's/\+[a-z0-9.]+$//' | sort -f
} > constraints/ci.txt
echo "constraints/ci.txt: $(grep -vc '^#' constraints/ci.txt) pinned distributions"
