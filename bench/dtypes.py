"""`race bench dtypes`: the cover in float32 and in bfloat16 (or any dtypes) on one checkpoint, in one run.

For each dtype the checkpoint is loaded in it and, on the same trajectories (a JSONL file, or the
long workload rendered with the checkpoint's own chat template, `bench.workload.LongWorkload`):

- the raw forward's throughput (decoder only, one batch, `bench.baselines.forward_throughput`);
- the scorer's noise (`HFScorer.measure_noise`: each request alone against all in one batch; the
  cover refuses an ε it does not stay far below, `race_core.cover.check_noise`);
- the hf cover at each ε, timed (wall and CPU), with its decisions.

Against the first dtype (the reference, float32 by default): each dtype's speed-up of the raw forward
and of each cover, the decisions that differ, and the drift of the drops themselves: the largest
|d_j difference| over the candidates both dtypes scored in the same context (every earlier decision
of the trajectory the same), against ε. A dtype is fit to decide at ε only where that drift is far
below ε and its decisions equal the reference's; the report says which. The machine's CPU model and
matrix extensions (`race_core.cpu`) are part of the report: bfloat16 is fast only on a CPU that
multiplies it in hardware (AMX-BF16, AVX512-BF16).
"""

from __future__ import annotations

import argparse
import json
import logging
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from bench.baselines import forward_throughput
from bench.workload import LongWorkload, long_trajectories
from race_core.cover import CoverResult, logic_cover
from race_core.cpu import cpu_facts, fast_bf16
from race_core.render import Renderer
from race_core.schema import Trajectory
from race_core.scoring import ScoreRequest

logger = logging.getLogger(__name__)

DTYPES = ("float32", "bfloat16")
EPSILONS = (0.3, 1e-3)
FIT_MARGIN = 10.0  # a dtype decides at ε when its drift is at most ε / FIT_MARGIN and its decisions equal the reference's


def _timed(run: Callable[[], Any]) -> tuple[Any, float, float]:
    wall, cpu = time.perf_counter(), time.process_time()
    out = run()
    return out, time.perf_counter() - wall, time.process_time() - cpu


def decisions(results: Sequence[CoverResult]) -> list[list[tuple[int, bool]]]:
    """Per trajectory, (candidate turn, accepted) in the cover's order."""
    return [[(entry["turn"], bool(entry["accepted"])) for entry in r.audit] for r in results]


def drift(reference: Sequence[CoverResult], other: Sequence[CoverResult]) -> tuple[float, int]:
    """The largest |d_j difference| between two covers of the same trajectories, over the candidates
    both scored in the same context (every earlier decision of the trajectory alike), and how many
    candidates that is."""
    worst, compared = 0.0, 0
    for a, b in zip(reference, other, strict=True):
        for x, y in zip(a.audit, b.audit, strict=False):
            if x["turn"] != y["turn"]:
                break
            if x["drops"] and y["drops"]:
                worst = max(worst, *(abs(p - q) for p, q in zip(x["drops"], y["drops"], strict=False)))
                compared += 1
            if bool(x["accepted"]) != bool(y["accepted"]):
                break  # later candidates of this trajectory see other contexts
    return worst, compared


def run_dtypes(checkpoint: str, trajectories: Sequence[Trajectory], dtypes: Sequence[str] = DTYPES,
               epsilons: Sequence[float] = EPSILONS, batch_size: int = 16, device: str = "cpu") -> dict[str, Any]:
    """Each dtype's raw forward, noise and covers on `trajectories`, compared with the first dtype's."""
    import torch

    from race_core.policy import load_policy
    from race_core.scoring.hf import HFScorer

    runs: list[dict[str, Any]] = []
    covers: dict[str, dict[float, list[CoverResult]]] = {}
    for dtype in dtypes:
        model, tokenizer = load_policy(checkpoint, device=device, dtype=dtype)
        renderer = Renderer(tokenizer)
        throughput = forward_throughput(model, renderer, trajectories, min(batch_size, len(trajectories)))
        noise = HFScorer(model, tokenizer, renderer=renderer, batch_size=batch_size).measure_noise(
            [ScoreRequest(("noise", i), t) for i, t in enumerate(trajectories[:4])])
        entry: dict[str, Any] = {"dtype": dtype, "forward_tokens_per_s": throughput[0],
                                 "forward_tokens_per_cpu_s": throughput[1], "noise": noise, "covers": []}
        covers[dtype] = {}
        for epsilon in epsilons:
            scorer = HFScorer(model, tokenizer, renderer=renderer, batch_size=batch_size)
            results, wall, cpu = _timed(lambda s=scorer, e=epsilon: logic_cover(list(trajectories), s, e))
            covers[dtype][epsilon] = results
            accepted = sum(len(r.skipped_turns) for r in results)
            entry["covers"].append({"epsilon": epsilon, "wall_s": wall, "cpu_s": cpu, "accepted": accepted,
                                    "candidates": sum(len(r.audit) for r in results),
                                    "tokens_processed": scorer.stats.tokens_processed})
            logger.info(f"{dtype} ε {epsilon:g}: cover {wall:.1f} s, {accepted} accepted; raw forward "
                f"{throughput[0]:,.0f} tokens/s; noise {noise:.2e}")
        runs.append(entry)
        del model
    reference = runs[0]
    for entry in runs:
        entry["forward_speedup"] = entry["forward_tokens_per_s"] / reference["forward_tokens_per_s"]
        for cover, ref in zip(entry["covers"], reference["covers"], strict=True):
            eps = cover["epsilon"]
            worst, compared = drift(covers[reference["dtype"]][eps], covers[entry["dtype"]][eps])
            ours, theirs = decisions(covers[entry["dtype"]][eps]), decisions(covers[reference["dtype"]][eps])
            cover.update(speedup=ref["wall_s"] / cover["wall_s"], cpu_speedup=ref["cpu_s"] / cover["cpu_s"],
                         decisions_equal=ours == theirs, drift=worst, drift_compared=compared,
                         fit=ours == theirs and worst <= eps / FIT_MARGIN and entry["noise"] <= eps / FIT_MARGIN)
    return {"checkpoint": str(checkpoint), "device": device, "N": len(trajectories),
            "T": f"{min(len(t.turns) for t in trajectories)}-{max(len(t.turns) for t in trajectories)}",
            "batch_size": batch_size, "torch_threads": torch.get_num_threads(), "cpu": cpu_facts(),
            "fast_bf16": fast_bf16(), "reference": reference["dtype"], "runs": runs}


def format_dtypes(report: dict[str, Any]) -> str:
    cpu = report["cpu"]
    lines = [f"### {Path(report['checkpoint']).name} on {report['device']}, N={report['N']}, T={report['T']}, "
             f"hf batch {report['batch_size']}; CPU {cpu['model']} ({', '.join(cpu['matrix_extensions']) or 'none'}; "
             f"bfloat16 in hardware: {'yes' if report['fast_bf16'] else 'no'})", "",
             "| dtype | raw forward tokens/s | vs " + report["reference"] + " | noise | ε | cover s | speed-up | "
             "CPU speed-up | accepted / candidates | decisions as " + report["reference"] + " | drift (max abs Δd) | "
             "fit to decide at ε |",
             "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | --- | ---: | --- |"]
    for entry in report["runs"]:
        for cover in entry["covers"]:
            lines.append(f"| {entry['dtype']} | {entry['forward_tokens_per_s']:,.0f} | {entry['forward_speedup']:.2f}x | "
                         f"{entry['noise']:.1e} | {cover['epsilon']:g} | {cover['wall_s']:.1f} | {cover['speedup']:.2f}x | "
                         f"{cover['cpu_speedup']:.2f}x | {cover['accepted']} / {cover['candidates']} | "
                         f"{'yes' if cover['decisions_equal'] else 'no'} | {cover['drift']:.1e} "
                         f"(on {cover['drift_compared']}) | {'yes' if cover['fit'] else 'no'} |")
    lines.append(f"fit: decisions equal to {report['reference']}'s, and drift and noise at most ε/{FIT_MARGIN:g}")
    return "\n".join(lines)


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--checkpoint", required=True, metavar="DIR", help="a save_pretrained folder")
    p.add_argument("--input", metavar="FILE.jsonl", help="the trajectories to score (default: the long workload)")
    p.add_argument("--limit", type=int, default=0, help="with --input: the first N valid trajectories (0 = all)")
    p.add_argument("--n", type=int, default=4, help="without --input: long-workload episodes")
    p.add_argument("--seed", type=int, default=0, help="without --input: the long workload's seed")
    p.add_argument("--dtypes", nargs="+", default=list(DTYPES), help="the first is the reference")
    p.add_argument("--epsilons", nargs="+", type=float, default=list(EPSILONS))
    p.add_argument("--batch-size", type=int, default=16)
    p.add_argument("--device", default="cpu")
    p.add_argument("--json", help="write the report here")


def cmd_bench_dtypes(args: argparse.Namespace) -> int:

    from transformers import AutoConfig

    from bench.scoring import read_input
    from race_core.policy import check_checkpoint_dir, load_tokenizer

    checkpoint = check_checkpoint_dir(args.checkpoint)
    renderer = Renderer(load_tokenizer(checkpoint))
    context = int(AutoConfig.from_pretrained(checkpoint, local_files_only=True).get_text_config()
                  .max_position_embeddings)
    if args.input:
        trajectories, _ = read_input(args.input, renderer, context, args.limit)
    else:
        trajectories = long_trajectories(renderer, LongWorkload(n=args.n, seed=args.seed), context)
    report = run_dtypes(str(checkpoint), trajectories, args.dtypes, args.epsilons, args.batch_size, args.device)
    print(format_dtypes(report))
    if args.json:
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).write_text(json.dumps(report, indent=1) + "\n")
    return 0
