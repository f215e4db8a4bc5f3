"""`race import --format openai|sharegpt|swe-agent|react --input FILES --out FILE.jsonl`: agent logs
-> trajectories in the input contract (DESIGN §2), for `race validate` / `race cover` / `race run`.

Streaming: each successful trajectory is written as its record is read, each skipped record is
listed on stderr as it is met (`FILE:LINE: [code] field: message`, LINE being the line the record
starts on), and a summary with the count per reason ends the run. The output is written to
`FILE.jsonl.partial` and renamed when the import is complete (`--out -` writes to stdout).
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
    from race_core.importers import FORMATS

    # conflict_handler: the generated --format (which also takes `race`) gives way to the required one below
    p = subparsers.add_parser("import", help="turn agent logs (OpenAI messages, ShareGPT, SWE-agent, ReAct text) "
                                             "into trajectories JSONL", conflict_handler="resolve")
    p.add_argument("--input", nargs="+", required=True,
                   help="files, globs or fsspec URLs: JSONL, one JSON document per file or a JSON array; plain or gzip")
    p.add_argument("--out", required=True, help="the JSONL to write ('-': standard output)")
    add_config_options(p, PipelineConfig(), top=(), sections=("ingest",))
    p.add_argument("--format", required=True, choices=list(FORMATS), dest=DEST + "ingest.format",
                   help="the logs' format")
    p.set_defaults(func=cmd_import)
    return p


def cmd_import(args) -> int:
    import fsspec

    from race_core.importers import ImportStats, import_stream
    from race_core.schema import Reject
    from tasks.stages import expand_inputs

    ingest = config_from_args(PipelineConfig(), args).ingest
    files = expand_inputs(args.input)
    stats = ImportStats()
    with _output(args.out) as out:
        for url in files:
            with fsspec.open(url, "rb") as fh:
                for item in import_stream(fh, url, ingest.format, ingest.import_options(), ingest.limits(), stats):
                    if isinstance(item, Reject):
                        print(f"  {item.file}:{item.line}: [{item.code}] {item.field}: {item.message}", file=sys.stderr)
                    else:
                        out.write(json.dumps(item.to_dict(), ensure_ascii=False) + "\n")
    skipped = sum(stats.skipped.values())
    reasons = ", ".join(f"{code} {n}" for code, n in stats.skipped.most_common())
    print(f"race import: {stats.imported} trajectories written to {args.out} from {len(files)} file(s); "
          f"{skipped} record(s) skipped" + (f" ({reasons})" if reasons else ""), file=sys.stderr)
    if stats.assumed_successful:
        print(f"race import: warning: {stats.assumed_successful} record(s) carry no success flag and were taken "
              f"as successful (--assume-successful)", file=sys.stderr)
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
