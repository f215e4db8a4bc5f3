"""Scoring noise per dtype: transformers vs vLLM on the same requests, next to the cover's ε.

For each dtype, both backends score the same requests (every action of each trajectory, then the
partial requests a cover round makes) over one local checkpoint; the table shows max |hf − vllm|,
each backend's batch-vs-alone noise (`measure_noise`) and whether the LoGiC cover decisions agree,
against ε = 1e-3. A decision is only trustworthy where this noise is far below ε.

    python scripts/gpu_check.py --device cuda --dtypes bfloat16 float32       # the GPU check
    python scripts/gpu_check.py --device cpu --dtypes float32 --preset tiny   # CPU smoke run

Without --checkpoint a random-weight model of the chosen preset is built in a temp folder (offline,
seeded); its near-uniform distributions understate the noise of a trained model, so pass a real
local checkpoint folder where one is at hand.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time

from race_core.cover import DEFAULT_EPSILON, logic_cover
from race_core.envs.expert import expert_dataset
from race_core.policy import checkpoint_digest
from race_core.scoring import ScoreRequest, make_scorer
from race_core.tiny import BENCH_20M, DEMO, TINY, ensure_checkpoint

# Head sizes vLLM's kernels take start at 32: the tiny preset runs with 2 heads (64 / 2).
PRESETS = {"tiny": TINY, "demo": DEMO, "20m": BENCH_20M}


def requests_for(trajectories) -> list[ScoreRequest]:
    full = [ScoreRequest(("full", i), t) for i, t in enumerate(trajectories)]
    tails = [ScoreRequest(("tail", i), t, from_turn=1) for i, t in enumerate(trajectories) if len(t.turns) > 1]
    return full + tails


def max_abs_diff(a: list[list[float]], b: list[list[float]]) -> float:
    return max((abs(x - y) for xs, ys in zip(a, b, strict=True) for x, y in zip(xs, ys, strict=True)), default=0.0)


def decisions(results) -> list[list[bool]]:
    return [[a["accepted"] for a in r.audit] for r in results]


def check_dtype(checkpoint: str, dtype: str, device: str, trajectories, epsilon: float, engine_options: dict) -> dict:
    requests = requests_for(trajectories)
    hf = make_scorer("hf", checkpoint, device=device, dtype=dtype)
    hf_scores = hf.score(requests)
    hf.release()
    hf_noise = hf.measure_noise(requests)
    hf_cover = logic_cover(trajectories, hf, epsilon)
    del hf

    started = time.perf_counter()
    with make_scorer("vllm", checkpoint, device=device, dtype=dtype, **engine_options) as vllm:
        engine_start_s = time.perf_counter() - started
        vllm_scores = vllm.score(requests)
        vllm_noise = vllm.measure_noise(requests)
        vllm_cover = logic_cover(trajectories, vllm, epsilon)
        tokens = vllm.stats.tokens_processed
    return {
        "dtype": dtype, "device": device, "epsilon": epsilon,
        "max_abs_hf_vs_vllm": max_abs_diff(hf_scores, vllm_scores),
        "vllm_batch_vs_alone": vllm_noise, "hf_batch_vs_alone": hf_noise,
        "decisions_equal": decisions(hf_cover) == decisions(vllm_cover),
        "accepted": sum(sum(d) for d in decisions(hf_cover)),
        "candidates": sum(len(d) for d in decisions(hf_cover)),
        "vllm_engine_start_s": round(engine_start_s, 1), "vllm_tokens_processed": tokens,
    }


def print_table(rows: list[dict]) -> None:
    header = (f"{'dtype':<10} {'max|hf-vllm|':>13} {'vllm noise':>11} {'hf noise':>10} {'eps':>8} "
              f"{'decisions':>10} {'accepted':>9} {'noise<<eps':>10}")
    print(header)
    print("-" * len(header))
    for r in rows:
        worst = max(r["max_abs_hf_vs_vllm"], r["vllm_batch_vs_alone"], r["hf_batch_vs_alone"])
        print(f"{r['dtype']:<10} {r['max_abs_hf_vs_vllm']:>13.2e} {r['vllm_batch_vs_alone']:>11.2e} "
              f"{r['hf_batch_vs_alone']:>10.2e} {r['epsilon']:>8.0e} "
              f"{'same' if r['decisions_equal'] else 'DIFFER':>10} {r['accepted']:>4}/{r['candidates']:<4} "
              f"{'yes' if worst * 10 < r['epsilon'] else 'NO':>10}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--dtypes", nargs="+", default=["bfloat16", "float32"])
    parser.add_argument("--checkpoint", help="local save_pretrained folder (default: a built preset)")
    parser.add_argument("--preset", choices=sorted(PRESETS), default="20m")
    parser.add_argument("--trajectories", type=int, default=32)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--epsilon", type=float, default=DEFAULT_EPSILON)
    parser.add_argument("--gpu-memory-utilization", type=float, default=0.3)
    parser.add_argument("--out", help="write the rows as JSON here")
    args = parser.parse_args(argv)

    engine_options: dict = {"enforce_eager": True}
    if args.device.startswith("cuda"):
        engine_options["gpu_memory_utilization"] = args.gpu_memory_utilization
    else:
        os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
    with tempfile.TemporaryDirectory(prefix="race-gpu-check-") as scratch:
        checkpoint = args.checkpoint or str(ensure_checkpoint(scratch, PRESETS[args.preset]))
        rows = run(checkpoint, args, engine_options)
    print_table(rows)
    if args.out:
        with open(args.out, "w") as f:
            json.dump(rows, f, indent=1)
    return 0


def run(checkpoint: str, args: argparse.Namespace, engine_options: dict) -> list[dict]:
    trajectories = expert_dataset(args.trajectories, seed=args.seed)
    print(f"checkpoint {checkpoint} (digest {checkpoint_digest(checkpoint)[:16]}), "
          f"{len(trajectories)} trajectories, seed {args.seed}, device {args.device}", flush=True)
    return [check_dtype(checkpoint, dtype, args.device, trajectories, args.epsilon, engine_options)
            for dtype in args.dtypes]


if __name__ == "__main__":
    sys.exit(main())
