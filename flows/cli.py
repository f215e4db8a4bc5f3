"""The `race` command line.

race validate --input FILE...            schema check only; counts and every reject listed
race cover [--input FILE...] [--checkpoint DIR] --out DIR
                                         LoGiC cover; Parquet through the artifact store
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

DEFAULT_HOME = Path(".race")


def _add_cover_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("--input", nargs="+", help="JSONL trajectory files (default: a generated calculator dataset)")
    p.add_argument("--checkpoint", help="local save_pretrained folder (default: the tiny built-in checkpoint)")
    p.add_argument("--epsilon", type=float, default=1e-3, help="max allowed drop of an action's mean log-prob")
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
    return parser


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


if __name__ == "__main__":
    raise SystemExit(main())
