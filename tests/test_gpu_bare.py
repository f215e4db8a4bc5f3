"""The bare-CUDA GPU check (`bench.gpu_bare`), run on the CPU: the smoke run CI keeps green so that
the script a GPU machine runs is known to work before one is at hand."""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]

# Run in a fresh interpreter: what it imported is then what the check needs, and a bare CUDA machine
# has torch and transformers but neither vLLM, Prefect nor the storage stack.
_SCRIPT = """
import json, sys
from bench.gpu_bare import main
main(sys.argv[1:])
print(json.dumps(sorted(m for m in ("prefect", "vllm", "pyarrow", "storage", "tasks", "flows") if m in sys.modules)))
"""


def test_the_bare_gpu_check_runs_the_cover_and_both_training_steps_importing_only_torch_transformers_and_race_core(
        tmp_path):
    out = tmp_path / "bare.json"
    done = subprocess.run(
        [sys.executable, "-c", _SCRIPT, "--device", "cpu", "--shapes", "toy", "--dtypes", "float32", "bfloat16",
         "--n", "4", "--turns", "3", "--batch-size", "4", "--matmul-size", "128", "--train-tokens", "256",
         "--rl-rollouts", "4", "--rl-new-tokens", "16", "--json", str(out)],
        cwd=REPO, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    assert json.loads(done.stdout.strip().splitlines()[-1]) == []  # none of them was imported
    report = json.loads(out.read_text())
    assert report["facts"]["bf16_matmul_tflops"] > 0 and report["facts"]["vocab"] == 512
    assert [(row["shape"], row["dtype"]) for row in report["rows"]] == [("toy", "float32"), ("toy", "bfloat16")]
    for row in report["rows"]:
        cover = row["cover"]
        assert "error" not in cover, cover
        assert cover["trajectories"] == 4 and [len(d) for d in cover["decisions"]] == [2] * 4  # turns 2 and 3
        # the cover computes at least the bound's tokens, and its FLOPs are counted from what it fed
        assert cover["work"]["tokens_processed"] >= cover["bound_tokens"] > 0
        assert cover["time_vs_bound"] > 0 and cover["time_vs_roofline"] > 0 and math.isfinite(cover["cover_tflops"])
        assert math.isfinite(row["sft"]["loss"]) and row["sft"]["tokens"] == 256
        assert row["rl"]["rollouts"] == 4 and row["rl"]["rollout_tokens"] > 0 and math.isfinite(row["rl"]["loss"])
        assert row["sft"]["peak_bytes"] is None  # device memory is measured on CUDA only
    assert "| a toy (CPU smoke run) | bfloat16 |" in done.stdout
