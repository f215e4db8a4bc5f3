"""`race bench scoring`: cover scoring, naive vs full-forward vs ours (hf, vllm) vs the work bound,
on synthetic workloads or (`--checkpoint DIR --input FILE.jsonl`) a real model on real trajectories;
`--record` keeps the report under `bench/results/` (`bench.records`).
`race bench compare A B`: two records side by side. `race bench table RECORD...`: the README's
performance table from records.
`race bench rendering`: the tokenizer's own ids vs segment-wise ids on a real checkpoint.
`race bench dtypes --checkpoint DIR`: the cover in float32 and bfloat16 (`bench.dtypes`).
`race bench sampling --checkpoint DIR`: episodes played by transformers and by vLLM (`bench.sampling`).
`race bench price`: this machine class's per-call price for the scorer's batch plans (`bench.price`).
`race bench rl --checkpoint DIR`: RL iterations, each phase timed, against the rebuilt loop (`bench.rl`).

`add_bench_parser(subparsers)` adds it to the `race` command; `main` is `scripts/bench_scoring.py`.
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
from pathlib import Path
from typing import Any

from bench import records
from bench.memory import format_rows, memory_bench
from bench.profile import format_profile
from bench.records import RESULTS, commit, load, record
from bench.report import format_demo, format_real_table, format_table
from bench.scoring import BenchOptions, run_bench
from bench.workload import MODELS, LongWorkload, Workload
from race_core.config import Resources
from race_core.cover import DEFAULT_EPSILON

SWEEP_TURNS = (2, 4, 8, 16)
logger = logging.getLogger(__name__)


def add_bench_parser(subparsers) -> argparse.ArgumentParser:
    """Add `bench scoring` to the `race` command's subparsers."""
    bench = subparsers.add_parser("bench", help="benchmarks")
    bench_sub = bench.add_subparsers(dest="bench", required=True)
    p = bench_sub.add_parser("scoring", help="cover scoring: naive, full-forward, hf, vllm vs the work bound")
    add_bench_arguments(p)
    p.set_defaults(func=cmd_bench_scoring)
    from bench.rendering import add_arguments, cmd_bench_rendering

    r = bench_sub.add_parser("rendering", help="canonical vs segment-wise token ids on a real checkpoint")
    add_arguments(r)
    r.set_defaults(func=cmd_bench_rendering)
    from bench.dtypes import add_arguments as add_dtypes_arguments
    from bench.dtypes import cmd_bench_dtypes

    d = bench_sub.add_parser("dtypes", help="the cover in float32 and bfloat16 on one checkpoint: speed, noise, "
                             "drift of the drops and decisions against ε")
    add_dtypes_arguments(d)
    d.set_defaults(func=cmd_bench_dtypes)
    from bench.sampling import add_arguments as add_sampling_arguments
    from bench.sampling import cmd_bench_sampling

    s = bench_sub.add_parser("sampling", help="the same episodes played by the transformers sampler and by vLLM's: "
                             "start, play time and generated tokens per second")
    add_sampling_arguments(s)
    s.set_defaults(func=cmd_bench_sampling)
    from bench.rl import add_arguments as add_rl_arguments
    from bench.rl import cmd_bench_rl

    rl = bench_sub.add_parser("rl", help="RL iterations on a checkpoint and environment, each phase timed "
                              "(--compare: against the loop that rebuilt its engine and trainer every iteration)")
    add_rl_arguments(rl)
    rl.set_defaults(func=cmd_bench_rl)
    from bench.price import add_arguments as add_price_arguments
    from bench.price import cmd_bench_price

    pr = bench_sub.add_parser("price", help="this machine class's per-call price for the scorer's batch plans, "
                              "for race_core/scoring/prices.json")
    add_price_arguments(pr)
    pr.set_defaults(func=cmd_bench_price)
    c = bench_sub.add_parser("compare", help="two benchmark records (bench/results/*.json) side by side")
    c.add_argument("a", metavar="A.json")
    c.add_argument("b", metavar="B.json")
    c.set_defaults(func=cmd_bench_compare)
    t = bench_sub.add_parser("table", help="the README's performance table from benchmark records")
    t.add_argument("records", nargs="+", metavar="RECORD.json")
    t.add_argument("--latest", action="store_true",
                   help="each workload's newest run on each machine only (the README's table)")
    t.add_argument("--out", help="write the table here too")
    t.add_argument("--readme", metavar="FILE",
                   help=f"replace the text between the lines {records.TABLE_START!r} and {records.TABLE_END!r} "
                        f"in FILE with the table")
    t.set_defaults(func=cmd_bench_table)
    return p


def add_bench_arguments(p: argparse.ArgumentParser) -> None:
    w = Workload()
    p.add_argument("--json", help="write the report here")
    p.add_argument("--record", nargs="?", const=str(RESULTS), metavar="DIR",
                   help=f"keep the report, with commit, machine facts and load, as a new JSON file in DIR "
                        f"(default {RESULTS.relative_to(RESULTS.parents[1])}/)")
    p.add_argument("--label", default="", help="with --record: a word for the record's file name")
    p.add_argument("--models", nargs="+", choices=MODELS, default=list(MODELS))
    p.add_argument("--workload", choices=("fixed", "long"), default="fixed",
                   help="fixed: N trajectories of T turns, every field one length; long: episodes of 5-40 turns, "
                        "observations of 20-400 tokens, reasoning of 0-150 per turn, cut to the model's context "
                        "(bench/workload.py), one run per model, or on --checkpoint without --input")
    p.add_argument("--n", type=int, help=f"trajectories (default {w.n}; {LongWorkload.n} with --workload long)")
    p.add_argument("--turns", type=int, nargs="+", default=[w.turns], help="turns per trajectory (T)")
    p.add_argument("--sweep", action="store_true", help=f"T over {', '.join(map(str, SWEEP_TURNS))}")
    p.add_argument("--question-tokens", type=int, default=w.question_tokens)
    p.add_argument("--reasoning-tokens", type=int, default=w.reasoning_tokens)
    p.add_argument("--action-tokens", type=int, default=w.action_tokens)
    p.add_argument("--observation-tokens", type=int, default=w.observation_tokens)
    p.add_argument("--seed", type=int, default=w.seed)
    p.add_argument("--batch-size", type=int,
                   help=f"hf scorer batch size (default {BenchOptions.batch_size}; with --checkpoint the "
                        f"pipeline's scoring default, {Resources.batch_size})")
    p.add_argument("--naive-subset", type=int, default=BenchOptions.naive_subset,
                   help="time naive on the first K trajectories and scale to N (0 = all)")
    p.add_argument("--no-naive", action="store_true", help="skip the naive method (hours on long episodes)")
    p.add_argument("--full-forward-subset", type=int, default=BenchOptions.full_forward_subset, help="same for full-forward (0 = all)")
    p.add_argument("--repeats", type=int, default=BenchOptions.repeats,
                   help="run hf, hf+early-reject and full-forward this many times, report the fastest")
    p.add_argument("--vllm", choices=["auto", "on", "off"], default="auto")
    p.add_argument("--profile", action="store_true",
                   help="then one more hf cover under torch.profiler: each forward's time by part (bench/profile.py)")
    p.add_argument("--no-early-reject", action="store_true", help="skip the early-rejection runs")
    p.add_argument("--no-warm-cover", action="store_true",
                   help="skip the untimed hf cover of the whole workload before the timed methods (then the "
                        "first timed method grows the process's heap for the others)")
    p.add_argument("--demo-data", type=int, default=BenchOptions.demo_data, help="expert trajectories for early rejection (0 = skip)")
    p.add_argument("--epsilon", type=float, default=DEFAULT_EPSILON)
    p.add_argument("--cache-dir", default=BenchOptions.cache_dir, help="where the checkpoints are built")
    p.add_argument("--checkpoint", metavar="DIR",
                   help="a real save_pretrained folder: bench it on --input instead of the synthetic runs "
                        "(--models, --n, --turns and the workload options are then unused)")
    p.add_argument("--input", metavar="FILE.jsonl", help="with --checkpoint: the trajectories to score")
    p.add_argument("--limit", type=int, default=0, help="with --checkpoint: the first N valid trajectories (0 = all)")
    p.add_argument("--device", default=BenchOptions.device, help="with --checkpoint: cpu, cuda, cuda:1, ...")
    p.add_argument("--dtype", default=BenchOptions.dtype, help="with --checkpoint: float32, bfloat16, float16")
    p.add_argument("--memory", action="store_true",
                   help="only: peak RSS of the cover stage (sharded) for each --memory-n")
    p.add_argument("--memory-n", type=int, nargs="+", default=[64, 1024])
    p.add_argument("--shard-size", type=int, default=64)


def options_from_args(args: argparse.Namespace) -> BenchOptions:
    long = LongWorkload(n=args.n or LongWorkload.n, seed=args.seed) if args.workload == "long" else None
    workload = Workload(n=args.n or Workload.n, question_tokens=args.question_tokens, reasoning_tokens=args.reasoning_tokens,
                        action_tokens=args.action_tokens, observation_tokens=args.observation_tokens,
                        seed=args.seed)
    return BenchOptions(models=tuple(args.models), turns=SWEEP_TURNS if args.sweep else tuple(args.turns),
                        workload=workload, long=long, batch_size=args.batch_size, naive_subset=args.naive_subset,
                        full_forward_subset=args.full_forward_subset, naive=not args.no_naive, vllm=args.vllm,
                        early_reject=not args.no_early_reject, epsilon=args.epsilon, cache_dir=args.cache_dir,
                        demo_data=args.demo_data, checkpoint=args.checkpoint, input=args.input, limit=args.limit,
                        device=args.device, dtype=args.dtype, repeats=args.repeats, profile=args.profile,
                        warm_cover=not args.no_warm_cover)


def cmd_bench_scoring(args: argparse.Namespace) -> int:
    if args.batch_size is None:  # a real checkpoint is scored as the pipeline scores it
        args.batch_size = Resources.batch_size if args.checkpoint else BenchOptions.batch_size
    if args.memory:
        model = args.models[0]
        rows = memory_bench(model, args.cache_dir, args.memory_n, args.shard_size, args.turns[0], args.batch_size)
        print(format_rows(rows))
        report: dict[str, Any] = {"memory": rows}
    else:
        before, code = load(), commit()  # the code that runs: taken before, edits during the run do not count
        report = run_bench(options_from_args(args))
        report.update(code)
        report["load"] = {"before": before, "after": load()}
        for run in report["runs"]:
            print((format_real_table(run) if report.get("mode") == "checkpoint" else format_table(run)) + "\n")
            if "profile" in run:
                print(format_profile(run["profile"], f"{run['model']} T={run['T']}") + "\n")
        if "demo_early_reject" in report:
            print(format_demo(report["demo_early_reject"]) + "\n")
    if args.json:
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).write_text(json.dumps(report, indent=1) + "\n")
    if args.record and not args.memory:  # the memory bench's rows are not a scoring report
        report["arguments"] = {k: v for k, v in vars(args).items() if k not in ("func", "command", "bench")}
        logger.info(f"recorded: {record(report, args.record, args.label)}")
    return 0


def cmd_bench_compare(args: argparse.Namespace) -> int:
    print(records.main_compare(args.a, args.b), end="")
    return 0


def cmd_bench_table(args: argparse.Namespace) -> int:
    text = records.main_table(args.records, newest_only=args.latest)
    print(text, end="")
    if args.out:
        Path(args.out).write_text(text)
    if args.readme:
        records.replace_table(args.readme, text)
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="bench_scoring", description=__doc__.splitlines()[0])
    add_bench_arguments(parser)
    logging.basicConfig(level=logging.INFO, format="%(message)s", stream=sys.stderr)  # outside `race`: lines on stderr
    return cmd_bench_scoring(parser.parse_args(argv))
