"""`race import --format auto|openai|sharegpt|swe-agent|react|responses|langchain --input FILES --out
FILE.jsonl`: agent logs -> trajectories in the input contract (docs/architecture.md §2), for `race validate` /
`race cover` / `race run`.

Streaming: each successful trajectory is written as its record is read, each skipped record and
each duplicate (a trajectory already written: merged into it, not written again) is listed on
stderr as it is met (`FILE:LINE: [code] field: message`, LINE being the line the record starts
on), `--format auto` says which format it picked for each file, and a summary ends the run: the
records read = those written + those skipped (per reason) + the duplicates. The output is written
to `FILE.jsonl.partial` and renamed when the import is complete (`--out -` writes to stdout).
The options are the ingest settings of `race run` / `race cover` (`race_core.config.IngestConfig`),
so an import and a `race cover --format ...` of the same logs read them alike.

`add_import_parser(subparsers)` adds it to the `race` command.
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TextIO

from flows.options import DEST, add_config_options, config_from_args
from race_core.config import PipelineConfig


def add_import_parser(subparsers):
    """Add `import` to the `race` command's subparsers."""
    from race_core.importers import AUTO, FORMATS

    # conflict_handler: the generated --format (which also takes `race`) gives way to the required one below
    p = subparsers.add_parser("import", help="turn agent logs (OpenAI chat or Responses, ShareGPT / LLaMA-Factory, "
                                             "SWE-agent, LangChain / LangSmith, ReAct text) into trajectories JSONL",
                              conflict_handler="resolve")
    p.add_argument("--input", nargs="+", required=True,
                   help="files, globs or fsspec URLs: JSONL, one JSON document per file or a JSON array; plain or gzip")
    p.add_argument("--out", required=True, help="the JSONL to write ('-': standard output)")
    add_config_options(p, PipelineConfig(), top=(), sections=("ingest",))
    p.add_argument("--format", required=True, choices=[AUTO, *FORMATS], dest=DEST + "ingest.format",
                   help="the logs' format (auto: picked per file from its records, and said)")
    p.set_defaults(func=cmd_import)
    return p


def cmd_import(args) -> int:
    import fsspec

    from race_core.importers import AUTO, ImportStats, import_stream, left_out_text
    from race_core.schema import Duplicates, Reject
    from tasks.stages import expand_inputs

    ingest = config_from_args(PipelineConfig(), args).ingest
    files = expand_inputs(args.input)
    stats = ImportStats()
    duplicates = Duplicates()
    with _output(args.out) as out:
        for url in files:
            with fsspec.open(url, "rb") as fh:
                for item in import_stream(fh, url, ingest.format, ingest.import_options(), ingest.limits(), stats,
                                          duplicates):
                    if isinstance(item, Reject):
                        print(f"  {item.file}:{item.line}: [{item.code}] {item.field}: {item.message}", file=sys.stderr)
                    else:
                        out.write(json.dumps(item.to_dict(), ensure_ascii=False) + "\n")
            if ingest.format == AUTO:
                picked = stats.formats.get(url)
                print(f"race import: {url}: " + (f"format {picked} (--format auto)" if picked else
                                                 "no record of a known format (--format auto)"), file=sys.stderr)
    skipped = sum(stats.skipped.values())
    reasons = ", ".join(f"{code} {n}" for code, n in stats.skipped.most_common())
    print(f"race import: {stats.read} record(s) read from {len(files)} file(s) = {stats.imported} trajectories "
          f"written to {args.out} + {skipped} record(s) skipped" + (f" ({reasons})" if reasons else "")
          + f" + {stats.duplicates} duplicate(s) merged into the first of each", file=sys.stderr)
    if stats.left_out_steps:
        print(f"race import: {left_out_text(stats)}", file=sys.stderr)
    if stats.assumed_successful:
        print(f"race import: warning: {stats.assumed_successful} of the trajectories written carry no success flag "
              f"and were taken as successful (--assume-successful)", file=sys.stderr)
    return 0 if stats.imported and not (ingest.strict and skipped) else 1


@contextmanager
def _output(path: str) -> Iterator[TextIO]:
    """stdout for '-'; else PATH.partial, renamed to PATH once everything is written."""
    if path == "-":
        yield sys.stdout
        return
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    partial = target.with_name(target.name + ".partial")
    with open(partial, "w", encoding="utf-8") as fh:
        yield fh
    os.replace(partial, target)
