"""Benchmark (not a test): train the bootstrap demo policy and evaluate it on held-out tasks.

Target on a 2-core CPU: >= 60% greedy success on 200 held-out tasks within 6 minutes in total.

    python scripts/bench_bootstrap.py [--out DIR] [--tasks 200] [--steps N] [--lr X] [--seed S]
                                      [--train-seed S]

Training is deterministic given the recipe; `--train-seed` (the SFT seed; here it sets the data order)
shows how much the figure moves from run to run.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import tempfile
import time
from pathlib import Path


def main() -> None:
    from race_core.evaluate import evaluate_policy, heldout_tasks
    from race_core.policy import checkpoint_digest, load_policy
    from race_core.train.bootstrap import BootstrapConfig, bootstrap_policy

    defaults = BootstrapConfig()
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default=None, help="output folder (default: a temporary one)")
    parser.add_argument("--tasks", type=int, default=200, help="held-out evaluation tasks")
    parser.add_argument("--steps", type=int, default=defaults.sft.steps)
    parser.add_argument("--lr", type=float, default=defaults.sft.lr)
    parser.add_argument("--batch-size", type=int, default=defaults.sft.batch_size)
    parser.add_argument("--expert-tasks", type=int, default=defaults.expert_tasks)
    parser.add_argument("--empty-reasoning-share", type=float, default=defaults.empty_reasoning_share)
    parser.add_argument("--seed", type=int, default=0, help="seed of the held-out draw")
    parser.add_argument("--train-seed", type=int, default=defaults.sft.seed, help="SFT seed (data order)")
    parser.add_argument("--max-new-tokens", type=int, default=64, help="per assistant turn in evaluation")
    args = parser.parse_args()

    sft = dataclasses.replace(defaults.sft, steps=args.steps, lr=args.lr, batch_size=args.batch_size,
                              seed=args.train_seed)
    config = dataclasses.replace(defaults, sft=sft, expert_tasks=args.expert_tasks,
                                 empty_reasoning_share=args.empty_reasoning_share)
    out = Path(args.out or tempfile.mkdtemp(prefix="race-bootstrap-"))
    started = time.perf_counter()

    def progress(step: int, total: int, loss: float) -> None:
        if step == 1 or step % 50 == 0 or step == total:
            print(f"  step {step}/{total} loss {loss:.4f} ({time.perf_counter() - started:.0f}s)", flush=True)

    result = bootstrap_policy(out / "policy", config, out / "base", progress)
    trained_at = time.perf_counter() - started
    model, tokenizer = load_policy(result.checkpoint)
    report = evaluate_policy(model, tokenizer, heldout_tasks(args.tasks, args.seed), greedy=True,
                             max_new_tokens=args.max_new_tokens, batch_size=max(args.tasks, 1))
    wall = time.perf_counter() - started
    losses = result.report.losses
    head, tail = losses[: min(10, len(losses))], losses[-min(10, len(losses)):]
    figures = {
        "wall_seconds": round(wall, 1),
        "train_seconds": round(trained_at, 1),
        "eval_seconds": round(wall - trained_at, 1),
        "train_loss_first": round(losses[0], 4),
        "train_loss_last": round(losses[-1], 4),
        "train_loss_first10_mean": round(sum(head) / len(head), 4),
        "train_loss_last10_mean": round(sum(tail) / len(tail), 4),
        "heldout_tasks": args.tasks,
        "greedy_success_rate": round(report.success_rate, 4),
        "reasoning_tokens_per_episode": round(report.reasoning_tokens_per_episode, 2),
        "turns_per_episode": round(report.turns_per_episode, 2),
        "well_formed_turn_rate": round(report.well_formed_rate, 4),
        "checkpoint": str(result.checkpoint),
        "checkpoint_digest": checkpoint_digest(result.checkpoint),
        "config": dataclasses.asdict(config),
        "heldout_seed": args.seed,
    }
    print(json.dumps(figures, indent=1, default=str))
    print(f"wall seconds: {wall:.1f} | train loss first/last: {losses[0]:.4f} / {losses[-1]:.4f} | "
          f"greedy success: {report.success_rate:.1%} on {args.tasks} held-out tasks | "
          f"reasoning tokens per episode: {report.reasoning_tokens_per_episode:.1f}")


if __name__ == "__main__":
    main()
