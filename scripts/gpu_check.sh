#!/usr/bin/env bash
# GPU check of the vllm backend (issue 6), on a CUDA machine with vllm and the test extra installed:
#   1. the backend contract suite (hf and vllm) on CUDA in float32;
#   2. the scoring-noise table in bfloat16 and float32 (max |hf - vllm|, batch-vs-alone noise, ε).
# Usage: scripts/gpu_check.sh [extra gpu_check.py options, e.g. --checkpoint DIR --out noise.json]
# CPU smoke run of step 2 only: python scripts/gpu_check.py --device cpu --dtypes float32 --preset tiny
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON="${PYTHON:-python}"
export PREFECT_SERVER_ANALYTICS_ENABLED=false

"$PYTHON" -c "import torch, vllm; assert torch.cuda.is_available(), 'no CUDA device'; print('torch', torch.__version__, 'vllm', vllm.__version__, torch.cuda.get_device_name(0))"
RACE_CONTRACT_DEVICE=cuda RACE_CONTRACT_DTYPE=float32 "$PYTHON" -m pytest tests/test_backend_contract.py -q -rs
"$PYTHON" scripts/gpu_check.py --device cuda --dtypes bfloat16 float32 "$@"
