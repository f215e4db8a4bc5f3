"""The `race` command line.

race validate --input FILE...      schema check only; counts and every reject listed
race cover --out DIR [...]         LoGiC cover without orchestration; Parquet via the artifact store
race run --input ... --checkpoint  the Prefect pipeline flow on your data and checkpoint
race demo                          the whole pipeline on embedded defaults, with a report
race ablate [--out DIR]            RACE against no / local-only / random / all removal, over SFT seeds; RL vs GRPO
race report --summary F            rebuild report.md, plots and report.html from a summary.json (+ decisions)
race serve                         serve the deployments (manual, nightly) to a Prefect server
race worker --pool P --device D    a worker of the pool (cover shards, sample chunks) on one device (`race run --pool P`)
race gc [--delete]                 list (or remove) unreferenced objects and litter older than --grace-hours
race bench scoring [--json FILE]   scoring benchmark: naive vs full-forward vs ours vs the work bound
race model smollm2                 build SmolLM2-135M-Instruct offline into a local checkpoint folder
race bootstrap --checkpoint DIR --out DIR2   train any chat checkpoint to play an environment (--env) in its own format
race env check NAME [--checkpoint DIR]       an environment (a plug-in's: module:attribute) fit to play? one line per problem
race import --format F --input ... --out FILE.jsonl   agent logs (openai, sharegpt, swe-agent, react, responses, langchain; auto) -> trajectories
race export --format F --input compressed.parquet --out FILE   compressed trajectories for TRL, LLaMA-Factory, verl
race train-node --store URL --job DIGEST --machine-rank R      join a training stage that spans several hosts

Every `race run` / `race cover` / `race demo` / `race serve` setting is a field of the configs in
`race_core.config`; the options are generated from them (`flows.options`).
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import signal
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from deployments import NIGHTLY_CRON, SERVE_DEFAULTS
from flows import LOGGERS
from flows.ablate import ABLATE_CONFIG, PRESETS
from flows.options import add_config_options, config_from_args
from race_core.ablation import ARMS, RL_ARMS
from race_core.config import (
    COVER_STAGES,
    DEFAULT_EPSILON,
    DEMO_CONFIG,
    SECTIONS,
    CoverConfig,
    PipelineConfig,
    Resources,
    field_help,
    replace,
)
from race_core.envs import env_argument, env_help
from race_core.train.checkpoint_bootstrap import RECIPES, AgentBootstrapConfig

DEFAULT_HOME = Path(".race")
COVER_SECTIONS = ("ingest", "cover", "resources")
FLOW_COMMANDS = ("run", "demo", "ablate")  # the commands that run a Prefect flow in this process


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="race", description="RACE: reasoning compression for tool-using agents")
    sub = parser.add_subparsers(dest="command", required=True)

    p = sub.add_parser("validate", help="check trajectories against the input contract")
    p.add_argument("--input", nargs="+", required=True)
    add_config_options(p, PipelineConfig(), top=(), sections=("ingest",))
    p.set_defaults(func=cmd_validate)

    # conflict_handler: the generated single-valued --epsilon gives way to the one below, which takes several
    p = sub.add_parser("cover", help="run the LoGiC cover and write decisions and compressed trajectories",
                       conflict_handler="resolve")
    add_config_options(p, PipelineConfig(), top=("inputs", "checkpoint", "store", "force"), sections=COVER_SECTIONS,
                       leave_out=tuple(f"resources.{name}" for name in Resources.TRAINING))  # it trains nothing
    p.add_argument("--epsilon", nargs="+", type=float, metavar="EPSILON", dest="epsilons",
                   help=f"{field_help(CoverConfig)['epsilon']} (default: {DEFAULT_EPSILON!r}); several values "
                        "run the cover for each, sharing scores, into OUT/eps-<value>/, with epsilon_sweep.md, "
                        ".json and .png in OUT")
    p.add_argument("--out", required=True, help="folder for decisions.parquet, compressed.parquet, rejects.parquet")
    p.add_argument("--home", default=str(DEFAULT_HOME),
                   help="where the default checkpoint and dataset are cached (no --input / --checkpoint)")
    p.set_defaults(func=cmd_cover)

    p = sub.add_parser("run", help="run the Prefect pipeline flow (cover, then training) on your data")
    add_config_options(p, PipelineConfig(), top=("inputs", "checkpoint", "store", "stages", "force", "report_dir"),
                       sections=SECTIONS, required=("inputs", "checkpoint"))
    p.add_argument("--seed", type=int, help="shorthand: the same seed for SFT, RL and evaluation")
    p.add_argument("--summary", help="write summary.json here")
    p.set_defaults(func=cmd_run)

    p = sub.add_parser("demo", help="bootstrap a small policy and run the whole pipeline, with a report")
    p.add_argument("--home", default=str(DEFAULT_HOME), help="checkpoints, data and the store (cached)")
    p.add_argument("--out", default="runs/demo", help="the report lands in OUT/report")
    p.add_argument("--seed", type=int, default=0, help="demo inputs, SFT, RL and evaluation seed")
    add_config_options(p, DEMO_CONFIG, top=(), sections=SECTIONS)
    p.set_defaults(func=cmd_demo)

    # conflict_handler: the generated single-valued --epsilon gives way to the one below, which takes several
    p = sub.add_parser("ablate", help="the method against its baselines: five arms x SFT seeds, then RL vs GRPO",
                       conflict_handler="resolve")
    p.add_argument("--home", default=str(DEFAULT_HOME), help="checkpoints, data and the store (cached)")
    p.add_argument("--out", default="runs/ablate", help="ablation.json, report.md and ablation.png land here")
    p.add_argument("--preset", choices=list(PRESETS), help="what runs, sized for where: tiny (the project's own "
                   "policy; the default without --checkpoint), cpu or gpu (a checkpoint; picked by --device)")
    add_config_options(p, ABLATE_CONFIG, top=("inputs", "checkpoint"),
                       sections=("cover", "resources", "sft", "rl", "evaluate"))
    p.add_argument("--env", type=env_argument, metavar="ENV", help="the environment the policy plays, RL samples and "
                   f"evaluation draws from ({env_help()}): sets --rl-env and --eval-env (default: the preset's)")
    p.add_argument("--seeds", type=int, nargs="+", help="SFT (and RL) seeds, one run each (default: the preset's)")
    p.add_argument("--input-tasks", type=int,
                   help="training tasks (of the preset's RL task shape) the policy plays for input, 2 episodes each "
                        "(default: the preset's)")
    p.add_argument("--arms", nargs="+", choices=ARMS, help="the arms to run (default: the preset's; race always)")
    p.add_argument("--rl-arms", nargs="+", metavar="RUN",
                   help=f"the RL runs: {', '.join(RL_ARMS)}, race+grpo+lp<λ>, race+adapt<δ> (default: the preset's; "
                        "each needs its SFT arm)")
    p.add_argument("--rl-seeds", type=int, metavar="N",
                   help="RL runs from the first N seeds' SFT policies (default: the preset's; 0: every seed)")
    p.add_argument("--epsilon", nargs="+", type=float, metavar="EPSILON", dest="epsilons",
                   help="ε of the cover; several: a sweep on the inputs chooses one and says why (default: the "
                        "preset's sweep for a checkpoint, 1e-3 for the tiny policy)")
    p.add_argument("--curve", type=int, metavar="N",
                   help="the trade-off curve: RACE and local-only also trained at the sweep's N ε on each side of "
                        "the chosen one, first seed (default: the preset's; 0: no curve, the run ends after RL)")
    p.add_argument("--recipe", choices=(*RECIPES, "none"),
                   help="how --checkpoint is made a calculator policy first (race bootstrap); none: it plays as it "
                        "is (default: expert-sft, or none when its tokenizer already carries the calculator prompt)")
    p.set_defaults(func=cmd_ablate)

    p = sub.add_parser("report", help="rebuild report.md, the plots and report.html from summary.json")
    p.add_argument("--summary", required=True, help="summary.json of a run")
    p.add_argument("--decisions", help="decisions.parquet (default: from the store named in the summary)")
    p.add_argument("--out", help="report folder (default: the summary's folder)")
    p.set_defaults(func=cmd_report)

    p = sub.add_parser("serve", help="serve the race-pipeline/manual and race-nightly/nightly deployments")
    add_config_options(p, SERVE_DEFAULTS, top=("inbox", "checkpoint", "store"), sections=COVER_SECTIONS)
    p.add_argument("--cron", default=NIGHTLY_CRON, help="nightly schedule (UTC)")
    p.add_argument("--gpu-slots", type=int, help="slots of the `gpu` concurrency limit: child runs doing units "
                   "at once across the pool (default: no limit, so as many as the pool has `race worker`s, each "
                   "running one at a time)")
    p.add_argument("--allow-root", nargs="+", metavar="ROOT",
                   help="folders and URL prefixes the served runs may read and write (inputs, checkpoint, "
                        "store, report_dir); default: this folder, the store, the checkpoint and the inbox's "
                        "folder")
    p.set_defaults(func=cmd_serve)

    p = sub.add_parser("gc", help="objects of the store that no manifest references, and abandoned litter")
    p.add_argument("--store", default=str(DEFAULT_HOME / "store"))
    p.add_argument("--delete", action="store_true", help="remove them (default: dry run, list only)")
    p.add_argument("--grace-hours", type=float, metavar="HOURS",
                   help="leave anything younger alone: a running stage writes its objects before its manifest "
                        "(default: the store's DEFAULT_GRACE_HOURS, 6)")
    p.set_defaults(func=cmd_gc)

    from bench.cli import add_bench_parser
    from flows.bootstrap_cli import add_bootstrap_parser
    from flows.env_cli import add_env_parser
    from flows.export_cli import add_export_parser
    from flows.import_cli import add_import_parser
    from flows.models_cli import add_model_parser
    from flows.train_node_cli import add_train_node_parser
    from flows.worker_cli import add_worker_parser

    add_bench_parser(sub)
    add_bootstrap_parser(sub)
    add_env_parser(sub)
    add_model_parser(sub)
    add_import_parser(sub)
    add_export_parser(sub)
    add_train_node_parser(sub)
    add_worker_parser(sub)
    return parser


def one_line_errors() -> tuple[type[BaseException], ...]:
    """The errors `race` reports as their one-line message (exit status 2): a bad input, parameter
    or file, a stage not run, a missing extra, and the store's faults (a full disk, a read-only or
    unwritable store, an object store that kept failing, a corrupt object)."""
    from storage.store import CorruptObjectError, StoreIOError  # imported here: pyarrow is slow

    return (FileNotFoundError, FileExistsError, ValueError, ImportError, LookupError, StoreIOError,
            CorruptObjectError)


class _NoTracebackForOneLineErrors(logging.Filter):
    """Prefect logs a failed task's and flow's traceback; for `one_line_errors` the message is the
    whole story, so the traceback is dropped (the message stays, in the console and the UI)."""

    def filter(self, record: logging.LogRecord) -> bool:
        error = record.exc_info[1] if record.exc_info else None
        if error is not None and isinstance(error, one_line_errors()):
            record.exc_info = record.exc_text = None
        return True


def _prefect_defaults() -> None:
    """Failed runs' one-line errors without Prefect's tracebacks (the settings Prefect reads at import
    are set in `flows/__init__.py`, before it is imported)."""
    for name in ("prefect.task_runs", "prefect.flow_runs"):
        logger = logging.getLogger(name)
        if not any(isinstance(f, _NoTracebackForOneLineErrors) for f in logger.filters):
            logger.addFilter(_NoTracebackForOneLineErrors())


class _Stderr(logging.StreamHandler):
    """Writes to `sys.stderr` as it is when a record comes (as the standard library's last resort does)."""

    def __init__(self):
        logging.Handler.__init__(self)

    @property
    def stream(self):
        return sys.stderr


@contextmanager
def console_lines(command: str) -> Iterator[None]:
    """Where the project's log lines go while `command` runs. In a command that runs a Prefect flow
    here (`FLOW_COMMANDS`) Prefect takes them: its console handler (on the root logger) prints them,
    and a line logged in a run goes to the API too. Any other command prints each line on stderr as
    the bare message, once: the project's loggers (`flows.LOGGERS`) get a handler of their own and
    pass nothing on to the root logger's handlers, until the command ends."""
    if command in FLOW_COMMANDS:
        yield
        return
    handler = _Stderr()
    handler.setFormatter(logging.Formatter("%(message)s"))
    passed_on = {logger: logger.propagate for logger in map(logging.getLogger, LOGGERS)}
    for logger in passed_on:
        logger.addHandler(handler)
        logger.propagate = False
    try:
        yield
    finally:
        for logger, propagate in passed_on.items():
            logger.removeHandler(handler)
            logger.propagate = propagate


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.command == "bench":
        _exit_on_sigterm()
    try:
        with console_lines(args.command):
            return int(args.func(args) or 0)
    except Exception as exc:
        if not isinstance(exc, one_line_errors()):
            raise
        print(f"race {args.command}: error: {exc}", file=sys.stderr)
        return 2


def _exit_on_sigterm() -> None:
    """A SIGTERM ends the process as Ctrl-C would: its `finally` blocks and atexit handlers run, so the
    vLLM engine processes a bench started are shut down with it instead of left running (the default
    action kills this process alone). Only where nothing else handles the signal."""
    if signal.getsignal(signal.SIGTERM) is signal.SIG_DFL:
        signal.signal(signal.SIGTERM, lambda signum, _frame: sys.exit(128 + signum))


def cmd_validate(args) -> int:
    from race_core.importers import RACE, import_stream
    from race_core.schema import DUPLICATE, Duplicates, Reject, Trajectory, read_jsonl

    ingest = config_from_args(PipelineConfig(), args).ingest
    duplicates: list[Reject] = []
    if ingest.format == RACE:
        good, rejects = read_jsonl(args.input, ingest.limits(), duplicates)
    else:  # agent logs: checked as `race import` / the ingest stage would read them
        good, rejects, first = [], [], Duplicates()
        for path in args.input:
            with open(path, "rb") as fh:
                for item in import_stream(fh, path, ingest.format, ingest.import_options(), ingest.limits(),
                                          duplicates=first):
                    if isinstance(item, Trajectory):
                        good.append(item)
                    else:
                        (duplicates if item.code == DUPLICATE else rejects).append(item)
    print(f"valid trajectories: {len(good)}")
    print(f"rejected lines: {len(rejects)}")
    print(f"duplicates: {len(duplicates)} (merged into the first of each; records read = "
          f"{len(good) + len(rejects) + len(duplicates)})")
    for r in [*rejects, *duplicates]:
        print(f"  {r.file}:{r.line}: [{r.code}] {r.field}: {r.message}")
    return 1 if rejects else 0


def cmd_cover(args) -> int:
    from flows.cover import run_cover
    from flows.sweep import check_epsilons, run_sweep

    config = replace(config_from_args(PipelineConfig(store=str(Path(args.home) / "store")), args),
                     stages=COVER_STAGES)
    epsilons = check_epsilons(args.epsilons) if args.epsilons else [config.cover.epsilon]
    if len(epsilons) == 1:
        summary = run_cover(replace(config, **{"cover.epsilon": epsilons[0]}), out_dir=Path(args.out),
                            home=Path(args.home))
        print(json.dumps(summary, indent=2))
        return 0
    sweep = run_sweep(config, epsilons, out_dir=Path(args.out), home=Path(args.home))
    rows = [{k: v for k, v in row.items() if k != "max_drops"} for row in sweep["rows"]]
    print(json.dumps({"epsilons": sweep["epsilons"], "rows": rows, "sharing": sweep["sharing"],
                      "table": str(Path(args.out) / "epsilon_sweep.md")}, indent=2))
    return 0


def cmd_run(args) -> int:
    _prefect_defaults()
    from flows.pipeline import race_pipeline

    config = config_from_args(PipelineConfig(), args)
    if args.seed is not None:
        config = config.with_seed(args.seed)
    summary = race_pipeline(config=config)
    text = json.dumps(summary, indent=2)
    if args.summary:
        Path(args.summary).parent.mkdir(parents=True, exist_ok=True)
        Path(args.summary).write_text(text + "\n")
    print(text)
    return 0


def cmd_demo(args) -> int:
    _prefect_defaults()
    from flows.demo import race_demo

    summary = race_demo(home=args.home, out=args.out, seed=args.seed, config=config_from_args(DEMO_CONFIG, args))
    report = Path(args.out) / "report"
    evals = summary.get("eval", {})
    print(json.dumps({"stages": summary["stages"], "cover": summary.get("cover"), "eval": evals}, indent=2))
    print(f"report: {report / 'report.md'} (plots and summary.json beside it)")
    return 0


def cmd_ablate(args) -> int:
    _prefect_defaults()
    from dataclasses import replace as replace_field

    from flows.ablate import PRESETS, preset_for, race_ablate
    from tasks.agent_bootstrap import plays

    given = config_from_args(ABLATE_CONFIG, args)
    preset = PRESETS[args.preset or preset_for(given.checkpoint, given.resources.device)]
    config = config_from_args(preset.config, args)
    if args.env:
        config = replace(config, **{"rl.env": args.env, "evaluate.env": args.env})
    bootstrap = (preset.bootstrap or AgentBootstrapConfig()) if config.checkpoint else None
    if bootstrap is not None and bootstrap.env != config.rl.env:  # the policy is made for the RL's environment
        bootstrap = replace_field(bootstrap, env=config.rl.env, shape=config.rl.shape, difficulty=config.rl.difficulty)
    if args.recipe == "none" or (args.recipe is None and config.checkpoint and plays(config.checkpoint, config.rl.env)):
        bootstrap = None
    elif args.recipe and bootstrap is not None:
        bootstrap = replace_field(bootstrap, recipe=args.recipe)
    arms = tuple(dict.fromkeys(["race", *args.arms])) if args.arms else preset.arms
    print(f"race ablate: preset {preset.name}" + (f"; left out of the full preset: {preset.left_out}"
                                                  if preset.left_out else ""), file=sys.stderr)
    result = race_ablate(home=args.home, out=args.out, seeds=tuple(args.seeds or preset.seeds),
                         input_tasks=args.input_tasks or preset.input_tasks, config=config, bootstrap=bootstrap,
                         epsilons=tuple(args.epsilons or preset.epsilons), arms=arms, preset=preset.name,
                         left_out=preset.left_out, length_penalties=preset.length_penalties,
                         rl_eval_every=preset.rl_eval_every,
                         curve=preset.curve if args.curve is None else args.curve,
                         rl_seeds=preset.rl_seeds if args.rl_seeds is None else args.rl_seeds,
                         skip_bonuses=preset.skip_bonuses, rl_arms=_rl_arms(args.rl_arms, preset))
    print((Path(args.out) / "report.md").read_text())
    print(f"ablation: {Path(args.out) / 'ablation.json'} ({result['run']['wall_s']} s)")
    return 0


def _rl_arms(asked: list[str] | None, preset) -> tuple[str, ...] | None:
    """The RL runs asked for, checked against the ones the preset's λ and δ make: an unknown name is an
    error that lists them."""
    from race_core.ablation import rl_phases

    if not asked:
        return preset.rl_arms
    known = [f"{arm}+{phase}" for arm, phase, _ in rl_phases(preset.length_penalties, preset.skip_bonuses)]
    unknown = [name for name in asked if name not in known]
    if unknown:
        raise SystemExit(f"race ablate: --rl-arms {' '.join(unknown)}: not one of this preset's RL runs ({', '.join(known)})")
    return tuple(asked)


def cmd_report(args) -> int:
    from report.markdown import write_report
    from storage import ArtifactStore, read_dataset
    from storage.parquet import read_dataset_from_store

    summary_path = Path(args.summary)
    summary = json.loads(summary_path.read_text())
    store = ArtifactStore(summary["run"]["store"]) if summary.get("run", {}).get("store") else None
    if args.decisions:
        decisions = read_dataset("decisions", args.decisions)
    elif summary.get("objects", {}).get("decisions") and store is not None:
        decisions = read_dataset_from_store(store, summary["objects"]["decisions"], "decisions")
    else:
        decisions = None
    written = write_report(args.out or summary_path.parent, summary, decisions, store=store)
    print(f"report: {written['report']}")
    print(f"page: {written['html']}")
    return 0


def cmd_serve(args) -> int:
    _prefect_defaults()
    from flows.serve import serve_deployments

    if not os.environ.get("PREFECT_API_URL"):
        print("race serve: PREFECT_API_URL is not set; start a server (`prefect server start`) and export "
              "PREFECT_API_URL=http://127.0.0.1:4200/api", file=sys.stderr)
        return 2
    from flows.roots import ROOTS_ENV, roots_env

    nightly = config_from_args(SERVE_DEFAULTS, args)
    roots = args.allow_root or [".", nightly.store, nightly.checkpoint,
                                str(Path(nightly.inbox.split("*", 1)[0]).parent)]
    os.environ[ROOTS_ENV] = roots_env(roots)  # the served flow runs inherit it
    print(f"race serve: runs may read and write only under: {', '.join(roots)}", file=sys.stderr)
    serve_deployments(nightly, cron=args.cron, gpu_slots=args.gpu_slots)
    return 0


def cmd_gc(args) -> int:
    from storage.gc import collect_garbage
    from storage.store import DEFAULT_GRACE_HOURS, ArtifactStore

    grace = DEFAULT_GRACE_HOURS if args.grace_hours is None else args.grace_hours
    report = collect_garbage(ArtifactStore(args.store), dry_run=not args.delete, grace_hours=grace)
    verb = "removed" if args.delete else "would remove (dry run; --delete to remove)"
    offset = report.clock_offset_s
    if offset is None:
        print("ages on this host's clock (the store could not be written to read its own)")
    elif abs(offset) >= 60:
        print(f"ages on the store's clock, which is {abs(offset) / 3600:.1f} h "
              f"{'ahead of' if offset > 0 else 'behind'} this host's")
    found = [("unreferenced object(s)", report.objects), ("abandoned temp file(s)", report.temp_files),
             ("quarantined corrupt object(s)", report.quarantined), ("abandoned multipart upload(s)", report.uploads),
             ("dead pool lease(s)", report.leases)]
    for what, items in found:
        print(f"{verb}: {len(items)} {what} older than {grace:g} h")
        for item in items:
            print(f"  {item}")
    if report.young:
        print(f"kept: {len(report.young)} unreferenced object(s) younger than {grace:g} h "
              "(a running stage may not have committed them yet)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
