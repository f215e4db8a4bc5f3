#!/usr/bin/env bash
# GPU check, on a CUDA machine. Part 0 needs only torch, transformers and this repository (no vLLM,
# no Prefect, no hub):
#   0. `python -m bench.gpu_bare` (issue 37): the hf scorer's cover on cuda in bfloat16 and float32 on
#      models built from a config (SmolLM2-135M, Qwen2.5-1.5B and Qwen2.5-7B shapes, random weights),
#      against the run's work bound and the GPU's bf16 matmul roofline, and one SFT step's and one RL
#      update's peak memory with gradient checkpointing; in runs/gpu-check/bare.json. RACE_TOKENIZER: a
#      folder holding a tokenizer only (default: the tiny one; SmolLM2's gives the real vocabulary).
# The rest runs only where vLLM and Prefect import (the vllm backend, issue 6):
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON="${PYTHON:-python}"
export PREFECT_SERVER_ANALYTICS_ENABLED=false

OUT=runs/gpu-check
mkdir -p "$OUT"
"$PYTHON" -c "import torch; assert torch.cuda.is_available(), 'no CUDA device'; print('torch', torch.__version__, torch.cuda.get_device_name(0))"
"$PYTHON" -m bench.gpu_bare --device cuda ${RACE_TOKENIZER:+--tokenizer "$RACE_TOKENIZER"} --json "$OUT/bare.json"
if ! "$PYTHON" -c "import vllm, prefect" 2>/dev/null; then
  echo "vllm or prefect does not import here: the bare part (runs/gpu-check/bare.json) is all this machine runs"
  exit 0
fi

"$PYTHON" -c "import torch, vllm; assert torch.cuda.is_available(), 'no CUDA device'; print('torch', torch.__version__, 'vllm', vllm.__version__, torch.cuda.get_device_name(0))"
RACE_CONTRACT_DEVICE=cuda RACE_CONTRACT_DTYPE=float32 "$PYTHON" -m pytest tests/test_backend_contract.py -q -rs
"$PYTHON" scripts/gpu_check.py --device cuda --dtypes bfloat16 float32 "$@"

CKPT=$("$PYTHON" -m flows.cli model smollm2)
"$PYTHON" scripts/react_sample.py --n 24 --out "$OUT/react.jsonl"
time "$PYTHON" -m flows.cli run --input "$OUT/react.jsonl" --checkpoint "$CKPT" --store "$OUT/store" \
  --backend vllm --device cuda --dtype float32 --epsilon 0.5 --sft-steps 20 --rl-iterations 1 --eval-tasks 20 \
  --report-dir "$OUT/report" --summary "$OUT/summary.json"

# 4. ε 0.7 gives mixed decisions on these 24 trajectories (16 of 36 removals accepted on CPU, float32).
"$PYTHON" -m flows.cli bench scoring --checkpoint "$CKPT" --input "$OUT/react.jsonl" --device cuda --dtype float32 \
  --epsilon 0.7 --vllm on --repeats 3 --json "$OUT/bench-scoring.json"

# 5. every stage on cuda; RACE_ABLATE=0 skips it (it is the long one: tens of minutes on one GPU).
if [ "${RACE_ABLATE:-1}" = "1" ]; then
  time "$PYTHON" -m flows.cli ablate --checkpoint "$CKPT" --device cuda --preset gpu --home "$OUT/ablate-home" \
    --out "$OUT/ablate"
fi
