#!/usr/bin/env bash
# GPU check of the vllm backend (issue 6), on a CUDA machine with vllm and the test extra installed:
#   1. the backend contract suite (hf and vllm) on CUDA in float32;
#   2. the scoring-noise table in bfloat16 and float32 (max |hf - vllm|, batch-vs-alone noise, ε);
#   3. the whole pipeline on a real instruct model (SmolLM2-135M-Instruct, `race model smollm2`):
#      the cover scored by vLLM, every stage on cuda (issue 13), with its report in runs/gpu-check.
#   4. scoring throughput on that model and data (issue 16): naive, full-forward, hf (with and without
#      early rejection) and vllm on cuda against the same run's work bound, in runs/gpu-check/bench-scoring.json.
#   5. the method's effect on that real model, the full GPU preset of `race ablate --checkpoint`: bootstrap
#      (expert SFT), its own episodes, the ε sweep, five arms x three SFT seeds, cover-aware RL vs GRPO, in
#      runs/gpu-check/ablate (ablation.json, report.md); every stage cached, so a rerun resumes.
# Usage: scripts/gpu_check.sh [extra gpu_check.py options, e.g. --checkpoint DIR --out noise.json]
# CPU smoke run of step 2 only: python scripts/gpu_check.py --device cpu --dtypes float32 --preset tiny
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON="${PYTHON:-python}"
export PREFECT_SERVER_ANALYTICS_ENABLED=false

"$PYTHON" -c "import torch, vllm; assert torch.cuda.is_available(), 'no CUDA device'; print('torch', torch.__version__, 'vllm', vllm.__version__, torch.cuda.get_device_name(0))"
RACE_CONTRACT_DEVICE=cuda RACE_CONTRACT_DTYPE=float32 "$PYTHON" -m pytest tests/test_backend_contract.py -q -rs
"$PYTHON" scripts/gpu_check.py --device cuda --dtypes bfloat16 float32 "$@"

CKPT=$("$PYTHON" -m flows.cli model smollm2)
OUT=runs/gpu-check
mkdir -p "$OUT"
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
