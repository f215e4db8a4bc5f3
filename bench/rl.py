"""`race bench rl`: RL iterations on a named checkpoint and environment, each phase timed.

    race bench rl --checkpoint DIR --env NAME --iterations N --tasks K --group G --json FILE

runs the rl stage itself (`tasks.rl_run`, on a temporary store, so checkpoint writes count) for N
iterations of K tasks x G rollouts, then a greedy held-out evaluation of `--eval-tasks` episodes on
the run's sampler, and reports per iteration its seconds and each phase's (engine start, weight load,
sampling, cover, the trainer's logp_old, the policy's forward and backward, closure, optimizer step,
checkpoint write), generated tokens per second, the rows of advantage 0 left out of the backward and
the time they would have cost; and the evaluation's seconds and episodes. The CPU (model and matrix
extensions, `race_core.cpu`) is part of the record.

`--compare`: the same run again as the pipeline ran RL before a run kept its engine and trainer
(`rl_run(live=False)`: every iteration and evaluation builds its sampler and loads its trainer from
the store, every row trains), in the same process on the same machine, and the ratios.
`--precision`: on the first iteration's rollouts (its first four groups), the update's loss and gradient under bf16 autocast
against float32 (the relative difference of the loss, the cosine of the gradients, the time of each),
and the sampler's log-probs against the trainer's in each precision: what decides whether bf16 is fit.
It runs last; on a CPU without bf16 matrix instructions (`fast_bf16` false in the record) its bf16
half is emulated and takes many times the float32 half. The JSON is written after each part, so a
long bench stopped part way keeps what it measured.
"""

from __future__ import annotations

import argparse
import json
import logging
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from race_core.cpu import cpu_facts, fast_bf16
from race_core.envs import env_argument, env_help

logger = logging.getLogger(__name__)


def _iteration_row(metrics: dict[str, Any]) -> dict[str, Any]:
    phases = metrics["phases"]
    sample_s = phases.get("sample", 0.0)
    generated = metrics.get("generated_tokens") or 0
    return {"iteration": metrics["iteration"], "seconds": metrics["seconds"], "phases": phases,
            "rollouts": metrics["rollouts"], "success_rate": metrics["success_rate"],
            "generated_tokens": generated, "generated_per_s": generated / sample_s if sample_s else None,
            "trained_tokens": metrics.get("trained_tokens"), "skipped_rows": metrics.get("skipped_rows"),
            "skipped_seconds_estimate": metrics.get("skipped_seconds_estimate"),
            "old_logprob_gap_max": metrics.get("old_logprob_gap_max")}


def run_rl_bench(checkpoint: str, env: str, iterations: int, tasks: int, group: int, *, eval_tasks: int = 64,
                 sampler: str = "vllm", mixed_precision: str = "no", lr: float = 1e-6, mini_batch: int = 0,
                 epochs: int = 1, epsilon: float = 0.03, max_new_tokens: int = 96, max_turns: int = 8,
                 micro_batch: int = 2, seed: int = 0, compare: bool = False, precision: bool = False,
                 vllm_eager: bool = True, on_part: Callable[[dict[str, Any]], None] | None = None) -> dict[str, Any]:
    """The record `race bench rl` prints and writes (the module docstring); `on_part` gets it as it
    stands after each part (a run, the precision check): a long bench stopped part way keeps those."""
    import torch

    from race_core.config import EvalConfig, Resources, RLConfig
    from storage import ArtifactStore
    from tasks.policy_ref import PolicyRef
    from tasks.rl_run import rl_run

    config = RLConfig(iterations=iterations, tasks_per_iteration=tasks, group_size=group, lr=lr, seed=seed,
                      env=env, sampler=sampler, mini_batch=mini_batch, epochs=epochs, micro_batch=micro_batch,
                      max_new_tokens=max_new_tokens, max_turns=max_turns, eval_every=iterations)
    evaluate = EvalConfig(tasks=eval_tasks, env=env, sampler=sampler, max_new_tokens=max_new_tokens,
                          max_turns=max_turns)
    resources = Resources(mixed_precision=mixed_precision, vllm_eager=vllm_eager)
    policy = PolicyRef.local(checkpoint)
    report: dict[str, Any] = {
        "cpu": cpu_facts(), "fast_bf16": fast_bf16(), "torch_threads": torch.get_num_threads(),
        "checkpoint": str(checkpoint), "policy_digest": policy.digest, "env": env,
        "config": {"iterations": iterations, "tasks": tasks, "group": group, "sampler": sampler, "lr": lr,
                   "mini_batch": mini_batch, "epochs": epochs, "micro_batch": micro_batch, "epsilon": epsilon,
                   "mixed_precision": mixed_precision, "max_new_tokens": max_new_tokens, "max_turns": max_turns,
                   "eval_tasks": eval_tasks, "vllm_eager": vllm_eager}}
    modes = [("after", True), *((("before", False),) if compare else ())]
    for name, live in modes:
        with tempfile.TemporaryDirectory(prefix="race-bench-rl-") as tmp:
            store = ArtifactStore(str(Path(tmp) / "store"))
            began = time.perf_counter()
            ran = rl_run(store, policy, config, epsilon, evaluate, resources, live=live)
            wall = time.perf_counter() - began
            evaluations = ran["metrics"]["evaluations"]
            run = {
                "wall_s": round(wall, 2), "engine_starts": ran["metrics"].get("engine_starts"),
                "iterations": [_iteration_row(m) for m in ran["metrics"]["iterations"]],
                "evaluation": {"episodes": evaluations[-1]["episodes"], "seconds": evaluations[-1]["seconds"],
                               "success_rate": evaluations[-1]["success_rate"],
                               "start_seconds": evaluations[0]["seconds"]} if evaluations else None}
            if name == "after":  # the record's own figures, at its top level
                report.update(run)
            else:
                report[name] = run
            if precision and name == "after":  # kept for the check, after the comparison
                from race_core.rollout import rollouts_from_json

                first = ran["metrics"]["iterations"][0]
                rollouts = rollouts_from_json(store.get_bytes(first["rollouts_object"]).decode("utf-8"))
                groups = sorted({r.group for r in rollouts})[:4]  # four groups: the comparison, not its size
                first_groups = [r for r in rollouts if r.group in groups]
        logger.info(f"bench rl {name}: {wall:.0f} s")
        _ratios(report)
        if on_part is not None:
            on_part(report)
    if precision:
        report["precision"] = precision_check(checkpoint, first_groups, config, epsilon)
        if on_part is not None:
            on_part(report)
    return report


def _ratios(report: dict[str, Any]) -> None:
    """before / after (the record's own run) of the iterations after the first (the first pays the
    engine's start) and of the evaluation: the speed-ups, in the record."""
    if "before" not in report:
        return
    def steady(run: dict[str, Any]) -> float:
        rows = run["iterations"][1:] or run["iterations"]
        return sum(r["seconds"] for r in rows) / len(rows)

    report["speedup"] = {"iteration_after_the_first": steady(report["before"]) / steady(report)}
    before, after = report["before"]["evaluation"], report["evaluation"]
    if before and after:
        report["speedup"]["evaluation"] = before["seconds"] / after["seconds"]


def precision_check(checkpoint: str, rollouts, config, epsilon: float) -> dict[str, Any]:
    """The first update's loss and raw gradient in float32 and under bf16 autocast, from the same
    policy on the same rollouts (clipping off, one step), and the sampler's log-probs against each."""
    import torch

    from race_core.config import replace
    from race_core.policy import load_policy
    from race_core.train.distributed import TrainOptions
    from race_core.train.rl import update_from_rollouts

    out: dict[str, Any] = {}
    grads = {}
    plain = replace(config, max_grad_norm=0.0, mini_batch=0, epochs=1)
    for mode in ("no", "bf16"):
        model, tokenizer = load_policy(checkpoint)
        began = time.perf_counter()
        report = update_from_rollouts(model, tokenizer, rollouts, plain, epsilon=epsilon,
                                      options=TrainOptions(mixed_precision=mode))
        seconds = time.perf_counter() - began
        grads[mode] = torch.cat([p.grad.flatten().double() for p in model.parameters() if p.grad is not None])
        out[mode] = {"loss": report.loss, "seconds": round(seconds, 2), "phases": report.phases,
                     "sampler_gap_max": report.counts.get("old_logprob_gap_max"),
                     "sampler_gap_mean": report.counts.get("old_logprob_gap_mean")}
    a, b = grads["no"], grads["bf16"]
    out["loss_relative_difference"] = abs(out["bf16"]["loss"] - out["no"]["loss"]) / max(abs(out["no"]["loss"]), 1e-12)
    out["gradient_cosine"] = float(torch.dot(a, b) / (a.norm() * b.norm()).clamp_min(1e-30))
    out["gradient_norm_ratio"] = float(b.norm() / a.norm().clamp_min(1e-30))
    out["bf16_vs_fp32_time"] = out["bf16"]["seconds"] / out["no"]["seconds"]
    return out


def format_rl(report: dict[str, Any]) -> str:
    cpu, cfg = report["cpu"], report["config"]
    lines = [f"### RL iterations: {Path(report['checkpoint']).name} in {report['env']}, {cfg['tasks']} tasks x "
             f"{cfg['group']} rollouts, {cfg['sampler']} sampling, mixed precision {cfg['mixed_precision']}; CPU "
             f"{cpu['model']} ({', '.join(cpu['matrix_extensions']) or 'no matrix extensions'}), "
             f"{report['torch_threads']} threads", ""]
    phases = ["engine_start", "weight_load", "sample", "cover", "old_logprobs", "policy_forward_backward", "closure",
              "optimizer", "checkpoint_write"]
    for mode in ("after", "before"):
        if mode == "before" and mode not in report:
            continue
        run = report if mode == "after" else report[mode]
        lines += [f"**{mode}** ({'one engine and trainer for the run' if mode == 'after' else 'rebuilt every iteration'};"
                  f" {run['wall_s']:.0f} s in all, {run['engine_starts']} engine start(s) in the run)", "",
                  "| iteration | s | " + " | ".join(phases) + " | generated/s | rows left out | won |",
                  "| ---: | ---: |" + " ---: |" * len(phases) + " ---: | ---: | ---: |"]
        for r in run["iterations"]:
            cells = [f"{r['phases'].get(p, 0.0):.1f}" for p in phases]
            rate = f"{r['generated_per_s']:.0f}" if r["generated_per_s"] else "-"
            lines.append(f"| {r['iteration']} | {r['seconds']:.1f} | " + " | ".join(cells)
                         + f" | {rate} | {r['skipped_rows'] or 0} | {100 * r['success_rate']:.0f}% |")
        if run["evaluation"]:
            e = run["evaluation"]
            lines += ["", f"evaluation: {e['episodes']} greedy episodes in {e['seconds']:.1f} s "
                          f"({100 * e['success_rate']:.1f}% won; the starting policy's took {e['start_seconds']:.1f} s)"]
        lines.append("")
    if "speedup" in report:
        lines.append("before / after: " + ", ".join(f"{k.replace('_', ' ')} {v:.2f}x" for k, v in report["speedup"].items()))
    if "precision" in report:
        p = report["precision"]
        gaps = ", ".join(f"{p[m]['sampler_gap_max']:.2e} ({name})" for m, name in (("no", "float32"), ("bf16", "bf16"))
                         if p[m]["sampler_gap_max"] is not None) or "none trained"
        lines.append(f"bf16 autocast against float32 on the first iteration's rollouts: loss {p['loss_relative_difference']:.2e} "
                     f"relative, gradient cosine {p['gradient_cosine']:.5f}, norm ratio {p['gradient_norm_ratio']:.4f}, "
                     f"time {p['bf16_vs_fp32_time']:.2f}x; sampler vs trainer log-probs, largest: {gaps}")
    return "\n".join(lines)


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--checkpoint", required=True, metavar="DIR", help="the policy (a save_pretrained folder)")
    p.add_argument("--env", type=env_argument, default="lookup", metavar="ENV", help=env_help())
    p.add_argument("--iterations", type=int, default=5)
    p.add_argument("--tasks", type=int, default=16, help="tasks per iteration")
    p.add_argument("--group", type=int, default=4, help="rollouts per task")
    p.add_argument("--eval-tasks", type=int, default=64, help="held-out episodes of the evaluation")
    p.add_argument("--sampler", choices=("hf", "vllm"), default="vllm")
    p.add_argument("--mixed-precision", choices=("no", "bf16"), default="no", help="the update's autocast")
    p.add_argument("--lr", type=float, default=1e-6)
    p.add_argument("--mini-batch", type=int, default=0, help="rollouts per optimizer step (0: all)")
    p.add_argument("--epochs", type=int, default=1)
    p.add_argument("--micro-batch", type=int, default=2, help="rollouts per forward of the update")
    p.add_argument("--epsilon", type=float, default=0.03, help="the RL cover's ε")
    p.add_argument("--max-new-tokens", type=int, default=96)
    p.add_argument("--max-turns", type=int, default=8)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--compare", action="store_true", help="also the run rebuilt every iteration (the baseline)")
    p.add_argument("--precision", action="store_true", help="bf16 autocast against float32 on one batch")
    p.add_argument("--no-vllm-eager", dest="vllm_eager", action="store_false")
    p.add_argument("--json", help="write the record here")


def cmd_bench_rl(args: argparse.Namespace) -> int:
    from race_core.policy import check_checkpoint_dir

    if args.iterations < 1:
        raise ValueError(f"--iterations {args.iterations}: the bench runs at least one iteration")

    def write(report: dict[str, Any]) -> None:
        if args.json:
            Path(args.json).parent.mkdir(parents=True, exist_ok=True)
            Path(args.json).write_text(json.dumps(report, indent=1) + "\n")

    report = run_rl_bench(str(check_checkpoint_dir(args.checkpoint)), args.env, args.iterations, args.tasks, args.group,
                          eval_tasks=args.eval_tasks, sampler=args.sampler, mixed_precision=args.mixed_precision,
                          lr=args.lr, mini_batch=args.mini_batch, epochs=args.epochs, epsilon=args.epsilon,
                          max_new_tokens=args.max_new_tokens, max_turns=args.max_turns, micro_batch=args.micro_batch,
                          seed=args.seed, compare=args.compare, precision=args.precision, vllm_eager=args.vllm_eager,
                          on_part=write)
    write(report)
    print(format_rl(report))
    return 0
