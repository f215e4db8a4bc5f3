"""`race export --format openai|sharegpt|tokens --out FILE`: compressed trajectories for the trainers
users already run (TRL, LLaMA-Factory, verl; the formats: `race_core.export`).

The trajectories come from `compressed.parquet` files (`--input`: what `race cover --out` writes; a
`trajectories.parquet` works too, nothing removed) or from a run's store (`--summary summary.json`:
the store and the compressed object it names). The output is JSONL (tokens: Parquet too, by the
`.parquet` suffix), written to `FILE.partial` and renamed when complete. Beside it: for sharegpt,
LLaMA-Factory's `dataset_info.json` with the dataset's entry (merged into one already there); for
tokens, `FILE.info.json` saying what the role codes mean and which checkpoint rendered the ids.

`add_export_parser(subparsers)` adds it to the `race` command.
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from flows.import_cli import _output
from race_core.export import AUTO, FORMATS, REASONING_FIELDS


def add_export_parser(subparsers):
    """Add `export` to the `race` command's subparsers."""
    p = subparsers.add_parser("export", help="write compressed trajectories for other trainers (TRL, "
                                             "LLaMA-Factory, verl): openai, sharegpt or tokens")
    p.add_argument("--format", required=True, choices=FORMATS, help="openai: chat messages with tool_calls and "
                   "reasoning (TRL's SFTTrainer); sharegpt: LLaMA-Factory's; tokens: the renderer's ids, "
                   "assistant mask and per-turn reasoning_removed flags")
    source = p.add_mutually_exclusive_group(required=True)
    source.add_argument("--input", nargs="+", metavar="PARQUET",
                        help="compressed.parquet files (race cover --out writes one), or trajectories.parquet")
    source.add_argument("--summary", help="a run's summary.json: export the compressed trajectories in its store")
    p.add_argument("--out", required=True, help="the file to write (JSONL; tokens: .parquet writes Parquet)")
    p.add_argument("--checkpoint", help="local checkpoint folder: its tokenizer renders the tokens format "
                   "(required there), and its chat template picks the openai reasoning field")
    p.add_argument("--reasoning-field", choices=(AUTO, *REASONING_FIELDS), default=AUTO,
                   help="openai: where an assistant message's reasoning goes; auto: the field the "
                        "checkpoint's chat template reads, else reasoning_content (default: auto)")
    p.add_argument("--dataset-name", help="sharegpt: its key in dataset_info.json (default: the output's name)")
    p.set_defaults(func=cmd_export)
    return p


def _rows(args) -> Iterator[dict[str, Any]]:
    """The rows to export: of the Parquet files, or of the compressed object a run's summary names."""
    from storage.parquet import iter_rows, iter_rows_from_store

    if args.summary:
        from storage import ArtifactStore

        summary = json.loads(Path(args.summary).read_text())
        store, digest = summary.get("run", {}).get("store"), summary.get("objects", {}).get("compressed")
        if not store or not digest:
            raise ValueError(f"--summary {args.summary!r} names no store (run.store) or no compressed object "
                             "(objects.compressed): was the compress stage run?")
        yield from iter_rows_from_store(ArtifactStore(store), digest, "compressed")
        return
    import pyarrow.parquet as pq

    for path in args.input:
        if not Path(path).is_file():
            raise FileNotFoundError(f"--input {path!r} is not a file")
        kind = ((pq.read_schema(path).metadata or {}).get(b"race.dataset") or b"compressed").decode()
        if kind not in ("compressed", "trajectories"):
            raise ValueError(f"--input {path!r} holds a {kind!r} dataset, not compressed trajectories")
        yield from iter_rows(kind, path)


def cmd_export(args) -> int:
    from race_core import export
    from storage.parquet import row_to_trajectory

    renderer = tokenizer = None
    if args.checkpoint:
        from race_core.policy import load_tokenizer
        from race_core.render import Renderer

        tokenizer = load_tokenizer(args.checkpoint)
        renderer = Renderer(tokenizer) if args.format == "tokens" else None
    elif args.format == "tokens":
        raise ValueError("--format tokens needs --checkpoint: the ids are its tokenizer's")
    field = args.reasoning_field
    if args.format == "openai" and field == AUTO:
        field = export.template_reasoning_field(tokenizer) if tokenizer is not None else "reasoning_content"
        print(f"race export: reasoning in the assistant messages' {field!r} field", file=sys.stderr)

    def records() -> Iterator[dict[str, Any]]:
        for row in _rows(args):
            trajectory, skipped = row_to_trajectory(row), row.get("skipped_turns") or ()
            if args.format == "openai":
                yield export.openai_record(trajectory, skipped, field)
            elif args.format == "sharegpt":
                yield export.sharegpt_record(trajectory, skipped)
            else:
                yield export.tokens_record(renderer, trajectory, skipped)

    out = Path(args.out)
    if args.format == "tokens" and out.suffix == ".parquet":
        count = _write_parquet(records(), out)
    else:
        count = 0
        with _output(args.out) as fh:
            for record in records():
                fh.write(json.dumps(record, ensure_ascii=False) + "\n")
                count += 1
    beside = _write_beside(args, out, renderer)
    print(f"race export: {count} trajectories written to {args.out} ({args.format})"
          + (f"; {beside}" if beside else ""), file=sys.stderr)
    return 0 if count else 1


def _write_beside(args, out: Path, renderer) -> str:
    """LLaMA-Factory's dataset_info.json entry (sharegpt) or the tokens' info file; what was written."""
    from race_core import export

    if args.format == "sharegpt":
        info = out.parent / "dataset_info.json"
        entries = json.loads(info.read_text()) if info.exists() else {}
        name = args.dataset_name or out.name.split(".")[0]
        entries[name] = export.dataset_info_entry(out.name)
        _replace_text(info, json.dumps(entries, indent=2, ensure_ascii=False) + "\n")
        return f"dataset {name!r} described in {info}"
    if args.format == "tokens":
        from race_core.policy import checkpoint_digest

        info = out.with_name(out.name.split(".")[0] + ".info.json")
        _replace_text(info, json.dumps(export.tokens_info(renderer, str(args.checkpoint),
                                                          checkpoint_digest(args.checkpoint)), indent=2) + "\n")
        return f"what the fields mean: {info}"
    return ""


def _replace_text(path: Path, text: str) -> None:
    partial = path.with_name(path.name + ".partial")
    partial.write_text(text, encoding="utf-8")
    os.replace(partial, path)


def _write_parquet(records: Iterator[dict[str, Any]], out: Path, batch: int = 512) -> int:
    import pyarrow as pa
    import pyarrow.parquet as pq

    out.parent.mkdir(parents=True, exist_ok=True)
    partial = out.with_name(out.name + ".partial")
    writer, rows, count = None, [], 0
    try:
        for record in records:
            rows.append(record)
            if len(rows) == batch:
                writer = _flush(writer, rows, partial, pa, pq)
                count, rows = count + len(rows), []
        if rows or writer is None:
            writer = _flush(writer, rows, partial, pa, pq)
            count += len(rows)
    finally:
        if writer is not None:
            writer.close()
    os.replace(partial, out)
    return count


def _flush(writer, rows: list[dict[str, Any]], path: Path, pa, pq):
    table = pa.Table.from_pylist(rows, schema=writer.schema if writer is not None else None)
    writer = writer or pq.ParquetWriter(path, table.schema)
    writer.write_table(table)
    return writer
