"""The `race` command line.

race validate --input FILE...      schema check only; counts and every reject listed
race cover --out DIR [...]         LoGiC cover without orchestration; Parquet via the artifact store
race run --input ... --checkpoint  the Prefect pipeline flow on your data and checkpoint
race demo                          the whole pipeline on embedded defaults, with a report
race report --summary F            rebuild report.md and plots from a summary.json (+ decisions)
race serve                         serve the deployments (manual, nightly) to a Prefect server
race gc [--delete]                 list (or remove) store objects no manifest references
race bench scoring [--json FILE]   scoring benchmark: naive vs full-forward vs ours vs the work bound
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

from race_core.cover import DEFAULT_EPSILON

DEFAULT_HOME = Path(".race")


def _add_cover_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("--input", nargs="+", help="JSONL trajectory files (default: a generated calculator dataset)")
    p.add_argument("--checkpoint", help="local save_pretrained folder (default: the tiny built-in checkpoint)")
    p.add_argument("--epsilon", type=float, default=DEFAULT_EPSILON, help="max allowed drop of an action's mean log-prob")
    p.add_argument("--backend", choices=["hf", "vllm"], default="hf")
    p.add_argument("--device", default="cpu")
    p.add_argument("--dtype", default="float32")
    p.add_argument("--batch-size", type=int, default=16)
    p.add_argument("--early-reject", action="store_true", help="score later actions only if the next one passes")
    p.add_argument("--store", help="artifact store root: folder or fsspec URL (default: .race/store)")
    p.add_argument("--strict", action="store_true", help="fail if any input line is rejected")
    p.add_argument("--home", default=str(DEFAULT_HOME), help="where built-in checkpoints and data are cached")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="race", description="RACE: reasoning compression for tool-using agents")
    sub = parser.add_subparsers(dest="command", required=True)

    p = sub.add_parser("validate", help="check trajectories against the input contract")
    p.add_argument("--input", nargs="+", required=True)
    p.add_argument("--max-field-chars", type=int, default=1_000_000)
    p.set_defaults(func=cmd_validate)

    p = sub.add_parser("cover", help="run the LoGiC cover and write decisions and compressed trajectories")
    _add_cover_options(p)
    p.add_argument("--out", required=True, help="folder for decisions.parquet, compressed.parquet, rejects.parquet")
    p.set_defaults(func=cmd_cover)

    p = sub.add_parser("run", help="run the Prefect pipeline flow (cover, then training) on your data")
    p.add_argument("--input", nargs="+", required=True, help="JSONL files, globs or fsspec URLs")
    p.add_argument("--checkpoint", required=True, help="local save_pretrained folder of the policy")
    p.add_argument("--store", default=str(DEFAULT_HOME / "store"), help="artifact store: folder or fsspec URL")
    p.add_argument("--backend", choices=["hf", "vllm"], default="hf")
    p.add_argument("--device", default="cpu")
    p.add_argument("--dtype", default="float32")
    p.add_argument("--epsilon", type=float, default=DEFAULT_EPSILON)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--rl-iterations", type=int, default=1)
    p.add_argument("--stages", nargs="+", help="only these stages (default: all)")
    p.add_argument("--strict", action="store_true")
    p.add_argument("--batch-size", type=int, default=16)
    p.add_argument("--early-reject", action="store_true")
    p.add_argument("--sft-epochs", type=int, default=1)
    p.add_argument("--sft-steps", type=int, default=0, help="optimizer steps (0: --sft-epochs passes)")
    p.add_argument("--sft-lr", type=float, default=1e-3)
    p.add_argument("--rl-tasks", type=int, default=8, help="calculator tasks per RL iteration")
    p.add_argument("--rl-group-size", type=int, default=4, help="rollouts per task (GRPO group)")
    p.add_argument("--rl-lr", type=float, default=1e-5)
    p.add_argument("--eval-tasks", type=int, default=100, help="held-out calculator tasks per evaluation")
    p.add_argument("--report-dir", help="write report.md, plots and summary.json here")
    p.add_argument("--summary", help="write summary.json here")
    p.set_defaults(func=cmd_run)

    p = sub.add_parser("demo", help="bootstrap a small policy and run the whole pipeline, with a report")
    p.add_argument("--home", default=str(DEFAULT_HOME), help="checkpoints, data and the store (cached)")
    p.add_argument("--out", default="runs/demo", help="the report lands in OUT/report")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--epsilon", type=float, default=DEFAULT_EPSILON, help="cover tolerance")
    p.set_defaults(func=cmd_demo)

    p = sub.add_parser("report", help="rebuild report.md and the plots from summary.json")
    p.add_argument("--summary", required=True, help="summary.json of a run")
    p.add_argument("--decisions", help="decisions.parquet (default: from the store named in the summary)")
    p.add_argument("--out", help="report folder (default: the summary's folder)")
    p.set_defaults(func=cmd_report)

    p = sub.add_parser("serve", help="serve the race-pipeline/manual and race-pipeline/nightly deployments")
    p.add_argument("--inbox", default="inbox/*.jsonl", help="nightly: glob or URL of new JSONL files")
    p.add_argument("--checkpoint", default=str(DEFAULT_HOME / "checkpoints" / "policy"))
    p.add_argument("--store", default=str(DEFAULT_HOME / "store"))
    p.add_argument("--cron", default="0 2 * * *", help="nightly schedule (UTC)")
    p.add_argument("--epsilon", type=float, default=DEFAULT_EPSILON)
    p.add_argument("--backend", choices=["hf", "vllm"], default="hf")
    p.add_argument("--device", default="cpu")
    p.set_defaults(func=cmd_serve)

    p = sub.add_parser("gc", help="objects of the store that no manifest references")
    p.add_argument("--store", default=str(DEFAULT_HOME / "store"))
    p.add_argument("--delete", action="store_true", help="remove them (default: dry run, list only)")
    p.set_defaults(func=cmd_gc)

    from race_core.bench_scoring import add_bench_parser

    add_bench_parser(sub)
    return parser


def _prefect_defaults() -> None:
    """Telemetry off and a patient temporary server on slow machines, unless the user set them."""
    os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")
    os.environ.setdefault("PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS", "180")


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return int(args.func(args) or 0)
    except (FileNotFoundError, ValueError, ImportError) as exc:
        print(f"race {args.command}: error: {exc}", file=sys.stderr)
        return 2


def cmd_validate(args) -> int:
    from race_core.schema import Limits, read_jsonl

    good, rejects = read_jsonl(args.input, Limits(max_field_chars=args.max_field_chars))
    print(f"valid trajectories: {len(good)}")
    print(f"rejected lines: {len(rejects)}")
    for r in rejects:
        print(f"  {r.file}:{r.line}: [{r.code}] {r.field}: {r.message}")
    return 1 if rejects else 0


def cmd_cover(args) -> int:
    from flows.cover_job import CoverJob, run_cover_job

    home = Path(args.home)
    job = CoverJob(
        inputs=[str(p) for p in args.input] if args.input else None,
        checkpoint=args.checkpoint,
        epsilon=args.epsilon,
        backend=args.backend,
        device=args.device,
        dtype=args.dtype,
        batch_size=args.batch_size,
        early_reject=args.early_reject,
        store=args.store or str(home / "store"),
        strict=args.strict,
        home=str(home),
    )
    summary = run_cover_job(job, out_dir=Path(args.out), log=lambda m: print(m, file=sys.stderr))
    print(json.dumps(summary, indent=2))
    return 0


def cmd_run(args) -> int:
    _prefect_defaults()
    from flows.pipeline import race_pipeline

    summary = race_pipeline(
        inputs=list(args.input), checkpoint=args.checkpoint, store=args.store, backend=args.backend,
        device=args.device, dtype=args.dtype, epsilon=args.epsilon, seed=args.seed,
        rl_iterations=args.rl_iterations, stages=args.stages, strict=args.strict, batch_size=args.batch_size,
        early_reject=args.early_reject, sft_epochs=args.sft_epochs, sft_steps=args.sft_steps, sft_lr=args.sft_lr,
        rl_tasks=args.rl_tasks, rl_group_size=args.rl_group_size, rl_lr=args.rl_lr, eval_tasks=args.eval_tasks,
        report_dir=args.report_dir,
    )
    text = json.dumps(summary, indent=2)
    if args.summary:
        Path(args.summary).parent.mkdir(parents=True, exist_ok=True)
        Path(args.summary).write_text(text + "\n")
    print(text)
    return 0


def cmd_demo(args) -> int:
    _prefect_defaults()
    from flows.demo import race_demo

    summary = race_demo(home=args.home, out=args.out, seed=args.seed, epsilon=args.epsilon)
    report = Path(args.out) / "report"
    evals = summary.get("eval", {})
    print(json.dumps({"stages": summary["stages"], "cover": summary.get("cover"), "eval": evals}, indent=2))
    print(f"report: {report / 'report.md'} (plots and summary.json beside it)")
    return 0


def cmd_report(args) -> int:
    from storage import ArtifactStore, read_dataset
    from storage.parquet import read_dataset_from_store
    from tasks.report import write_report

    summary_path = Path(args.summary)
    summary = json.loads(summary_path.read_text())
    if args.decisions:
        decisions = read_dataset("decisions", args.decisions)
    elif summary.get("objects", {}).get("decisions") and summary.get("run", {}).get("store"):
        decisions = read_dataset_from_store(ArtifactStore(summary["run"]["store"]), summary["objects"]["decisions"],
                                            "decisions")
    else:
        decisions = None
    written = write_report(args.out or summary_path.parent, summary, decisions)
    print(f"report: {written['report']}")
    return 0


def cmd_serve(args) -> int:
    _prefect_defaults()
    from deployments import DeploymentDefaults, serve_deployments

    if not os.environ.get("PREFECT_API_URL"):
        print("race serve: PREFECT_API_URL is not set; start a server (`prefect server start`) and export "
              "PREFECT_API_URL=http://127.0.0.1:4200/api", file=sys.stderr)
        return 2
    serve_deployments(DeploymentDefaults(inbox=args.inbox, checkpoint=args.checkpoint, store=args.store,
                                         cron=args.cron, epsilon=args.epsilon, backend=args.backend,
                                         device=args.device))
    return 0


def cmd_gc(args) -> int:
    from storage import ArtifactStore

    unreferenced = ArtifactStore(args.store).gc(dry_run=not args.delete)
    verb = "removed" if args.delete else "would remove (dry run; --delete to remove)"
    print(f"{verb}: {len(unreferenced)} object(s)")
    for digest in unreferenced:
        print(f"  {digest}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
