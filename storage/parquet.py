"""Parquet datasets of the pipeline (docs/architecture.md §7): schemas, streaming writers, readers.

Four datasets, one Arrow schema each (module constants, also in `SCHEMAS`):
- `trajectories`: the validated inputs, one row per trajectory.
- `rejects`: input lines that broke the contract, with file, line and error code.
- `decisions`: one row per (trajectory x candidate turn) of the LoGiC cover.
- `compressed`: the compressed trajectories plus what the cover removed.

Writers stream: rows are buffered up to `row_group_size` and written as one row group through
`pyarrow.parquet.ParquetWriter`, so memory does not grow with the dataset. Every file carries
`race.dataset = <kind>` in its schema metadata; readers refuse a file of another kind.
"""

from __future__ import annotations

import json
import os
import tempfile
import uuid
from collections.abc import Iterable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any, BinaryIO

import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq

from race_core.schema import Reject, ToolCall, Trajectory, Turn, canonical_json
from storage.store import ArtifactStore

DEFAULT_ROW_GROUP = 8192
SCHEMA_VERSION = "1"
KINDS = ("trajectories", "rejects", "decisions", "compressed", "episodes")

TURN_TYPE = pa.struct(
    [
        pa.field("reasoning", pa.string()),
        pa.field("action", pa.string()),  # the action text; for tool calls their JSON text (Turn.action_text)
        pa.field("observation", pa.string()),
        pa.field("tool_calls", pa.string()),  # JSON list of {name, arguments[, id]}; null for a text action
    ]
)


def _schema(kind: str, fields: list[pa.Field]) -> pa.Schema:
    return pa.schema(fields, metadata={"race.dataset": kind, "race.schema_version": SCHEMA_VERSION})


_TRAJECTORY_FIELDS = [
    pa.field("id", pa.string(), nullable=False),
    pa.field("question", pa.string()),
    pa.field("environment", pa.string()),
    pa.field("source_revision", pa.string()),
    pa.field("split", pa.string()),
    pa.field("successful", pa.bool_()),
    pa.field("turns", pa.list_(TURN_TYPE)),
    pa.field("extra", pa.string()),  # JSON object of the input keys outside the contract
    pa.field("system", pa.string()),  # the system prompt ("" when none)
    pa.field("tools", pa.string()),  # JSON list of the tools' schemas ("[]" when none)
]

TRAJECTORIES_SCHEMA = _schema("trajectories", _TRAJECTORY_FIELDS)

REJECTS_SCHEMA = _schema(
    "rejects",
    [
        pa.field("file", pa.string()),
        pa.field("line", pa.int64()),
        pa.field("code", pa.string()),
        pa.field("field", pa.string()),
        pa.field("message", pa.string()),
        pa.field("trajectory_id", pa.string()),  # a trajectory refused after ingest (too_long)
    ],
)

DECISIONS_SCHEMA = _schema(
    "decisions",
    [
        pa.field("trajectory_id", pa.string(), nullable=False),
        pa.field("turn", pa.int32(), nullable=False),
        pa.field("accepted", pa.bool_()),
        pa.field("reason", pa.string()),  # why not accepted (over_epsilon, non_finite, empty_reasoning); null if accepted
        pa.field("skipped_empty", pa.bool_()),  # reasoning already empty: not scored
        pa.field("drops", pa.list_(pa.float64())),  # d_j for j >= turn
        pa.field("max_drop", pa.float64()),  # null when not scored
        pa.field("reasoning_tokens", pa.int32()),  # tokens of the removed reasoning
        pa.field("action_tokens", pa.int32()),
        pa.field("epsilon", pa.float64()),
        pa.field("model_digest", pa.string()),
        pa.field("backend", pa.string()),
        pa.field("render_mode", pa.string()),  # e.g. canonical/keeps-reasoning (race_core.render)
    ],
)

COMPRESSED_SCHEMA = _schema(
    "compressed",
    [
        *_TRAJECTORY_FIELDS,
        pa.field("skipped_turns", pa.list_(pa.int32())),
        pa.field("reasoning_tokens_before", pa.int64()),
        pa.field("reasoning_tokens_after", pa.int64()),
        pa.field("model_digest", pa.string()),
        pa.field("epsilon", pa.float64()),
    ],
)

# Episodes a policy played (an evaluation's): the trajectory columns (`successful`: the environment's
# judge), and what the paper's figures are computed from, so a later metric needs no replay.
EPISODES_SCHEMA = _schema(
    "episodes",
    [
        *_TRAJECTORY_FIELDS,
        pa.field("task_id", pa.string()),
        pa.field("sample_index", pa.int32()),
        pa.field("reward", pa.float64()),
        pa.field("finished", pa.bool_()),  # ended by the agent (finish / the judge), not by the turn budget
        pa.field("well_formed", pa.list_(pa.bool_())),  # per turn: the generation followed the format
        pa.field("reasoning_tokens", pa.list_(pa.int32())),  # per turn: generated reasoning tokens
        pa.field("generated_tokens", pa.int64()),  # every token the policy generated
        pa.field("policy_digest", pa.string()),
    ],
)

SCHEMAS: dict[str, pa.Schema] = {
    "trajectories": TRAJECTORIES_SCHEMA,
    "rejects": REJECTS_SCHEMA,
    "decisions": DECISIONS_SCHEMA,
    "compressed": COMPRESSED_SCHEMA,
    "episodes": EPISODES_SCHEMA,
}


def schema_for(kind: str) -> pa.Schema:
    """The Arrow schema of dataset `kind` (one of `KINDS`)."""
    try:
        return SCHEMAS[kind]
    except KeyError:
        raise ValueError(f"unknown dataset kind {kind!r}; expected one of {KINDS}") from None


# -- rows <-> domain objects ---------------------------------------------------------------------
def trajectory_row(t: Trajectory) -> dict[str, Any]:
    """A `trajectories` row for `t` (`extra` as canonical JSON)."""
    return {
        "id": t.id,
        "question": t.question,
        "environment": t.environment,
        "source_revision": t.source_revision,
        "split": t.split,
        "successful": t.successful,
        "turns": [_turn_row(turn) for turn in t.turns],
        "extra": canonical_json(t.extra),
        "system": t.system,
        "tools": _ordered_json(list(t.tools)),
    }


def episode_row(episode: Any, policy_digest: str) -> dict[str, Any]:
    """An `episodes` row for a played episode (a `race_core.rollout.Rollout`): its turns as the policy
    wrote them, the judge's verdict, and per turn the format verdict and the reasoning tokens."""
    turns = range(len(episode.turns))
    return {
        "id": f"{episode.task_id}#{episode.sample_index}", "question": episode.question,
        "environment": episode.environment, "source_revision": "", "split": "heldout",
        "successful": bool(episode.success), "turns": [_turn_row(turn) for turn in episode.turns],
        "extra": "{}", "system": episode.system, "tools": _ordered_json(list(episode.tools)),
        "task_id": episode.task_id, "sample_index": int(episode.sample_index), "reward": float(episode.reward),
        "finished": bool(episode.finished), "well_formed": [bool(x) for x in episode.well_formed],
        "reasoning_tokens": [episode.reasoning_token_count(t) for t in turns],
        "generated_tokens": int(sum(episode.policy_mask)), "policy_digest": policy_digest,
    }


def _turn_row(turn: Turn) -> dict[str, Any]:
    calls = turn.tool_calls
    return {"reasoning": turn.reasoning, "action": turn.action_text, "observation": turn.observation,
            "tool_calls": _ordered_json([call.to_dict() for call in calls]) if calls else None}


def _ordered_json(value: Any) -> str:
    """JSON keeping the keys' order: chat templates render arguments and schemas in that order."""
    return json.dumps(value, ensure_ascii=False, separators=(",", ":"))


def _turn_of_row(x: Mapping[str, Any]) -> Turn:
    calls = x.get("tool_calls")
    action = (tuple(ToolCall(c["name"], c["arguments"], c.get("id", "")) for c in json.loads(calls)) if calls
              else x["action"])
    return Turn(reasoning=x["reasoning"] or "", action=action, observation=x["observation"] or "")


def compressed_row(
    t: Trajectory,
    skipped_turns: Sequence[int],
    reasoning_tokens_before: int,
    reasoning_tokens_after: int,
    model_digest: str,
    epsilon: float,
) -> dict[str, Any]:
    """A `compressed` row: the compressed trajectory plus what the cover removed."""
    return {
        **trajectory_row(t),
        "skipped_turns": [int(i) for i in skipped_turns],
        "reasoning_tokens_before": int(reasoning_tokens_before),
        "reasoning_tokens_after": int(reasoning_tokens_after),
        "model_digest": model_digest,
        "epsilon": float(epsilon),
    }


def row_to_trajectory(row: Mapping[str, Any]) -> Trajectory:
    """The Trajectory of a `trajectories` or `compressed` row (dict, pandas row or Arrow pylist)."""
    extra = row.get("extra")
    turns = tuple(_turn_of_row(x) for x in row["turns"])
    tools = row.get("tools")
    return Trajectory(
        question=row["question"],
        environment=row["environment"],
        source_revision=row["source_revision"],
        turns=turns,
        split=row["split"],
        successful=bool(row["successful"]),
        extra=json.loads(extra) if extra else {},
        id=row["id"],
        system=row.get("system") or "",
        tools=tuple(json.loads(tools)) if tools else (),
    )


def _as_row(kind: str, item: Any) -> Mapping[str, Any]:
    if isinstance(item, Trajectory):
        if kind != "trajectories":
            raise TypeError(f"a Trajectory is a 'trajectories' row; for {kind!r} build the row dict")
        return trajectory_row(item)
    if isinstance(item, Reject):
        return item.to_dict()
    return item


# -- writing ------------------------------------------------------------------------------------
class DatasetWriter:
    """Streaming writer of one dataset to a local path or a binary file-like.

    Use as a context manager; `write(row)` buffers, a full buffer becomes one row group.
    """

    def __init__(
        self,
        kind: str,
        sink: str | os.PathLike[str] | BinaryIO,
        row_group_size: int = DEFAULT_ROW_GROUP,
        compression: str = "zstd",
    ):
        self.kind = kind
        self.schema = schema_for(kind)
        self.row_group_size = row_group_size
        self.rows = 0
        self._names = set(self.schema.names)
        self._buffer: list[Mapping[str, Any]] = []
        sink = os.fspath(sink) if isinstance(sink, (str, os.PathLike)) else sink
        self._writer = pq.ParquetWriter(sink, self.schema, compression=compression)

    def write(self, item: Any) -> None:
        """Add one row (dict, or Trajectory / Reject where they fit)."""
        row = _as_row(self.kind, item)
        missing = self._names.difference(row)
        if missing:
            raise ValueError(f"{self.kind} row lacks columns {sorted(missing)}")
        self._buffer.append(row)
        if len(self._buffer) >= self.row_group_size:
            self.flush()

    def write_many(self, items: Iterable[Any]) -> None:
        """Add every row of `items` (streamed)."""
        for item in items:
            self.write(item)

    def flush(self) -> None:
        """Write the buffered rows as one row group."""
        if self._buffer:
            table = pa.Table.from_pylist(self._buffer, schema=self.schema)
            self._writer.write_table(table, row_group_size=self.row_group_size)
            self.rows += len(self._buffer)
            self._buffer = []

    def close(self) -> int:
        """Flush and finish the file; return the number of rows written."""
        try:
            self.flush()
        finally:
            self._writer.close()
        return self.rows

    def __enter__(self) -> DatasetWriter:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def write_dataset(
    kind: str,
    rows: Iterable[Any],
    dest: str | os.PathLike[str] | BinaryIO,
    row_group_size: int = DEFAULT_ROW_GROUP,
) -> int:
    """Write a whole dataset; return its row count.

    A local path is written under a temporary name and renamed, so a crash never leaves a
    partial file under `dest`.
    """
    if not isinstance(dest, (str, os.PathLike)):
        with DatasetWriter(kind, dest, row_group_size) as writer:
            writer.write_many(rows)
        return writer.rows
    dest = Path(dest)
    dest.parent.mkdir(parents=True, exist_ok=True)
    tmp = dest.with_name(f".tmp-{uuid.uuid4().hex}-{dest.name}")
    try:
        with DatasetWriter(kind, tmp, row_group_size) as writer:
            writer.write_many(rows)
        os.replace(tmp, dest)
    finally:
        if tmp.exists():
            tmp.unlink()
    return writer.rows


def write_dataset_to_store(
    store: ArtifactStore, kind: str, rows: Iterable[Any], row_group_size: int = DEFAULT_ROW_GROUP
) -> tuple[str, int]:
    """Write a dataset to a local temp file, put it in the store; return (digest, row count)."""
    with tempfile.TemporaryDirectory(prefix="race-parquet-") as tmpdir:
        path = Path(tmpdir) / f"{kind}.parquet"
        count = write_dataset(kind, rows, path, row_group_size)
        return store.put_file(path), count


# -- reading ------------------------------------------------------------------------------------
def _check_kind(kind: str, schema: pa.Schema, where: object) -> None:
    found = (schema.metadata or {}).get(b"race.dataset")
    if found is not None and found.decode() != kind:
        raise ValueError(f"{where} holds a {found.decode()!r} dataset, not {kind!r}")


def read_dataset(
    kind: str,
    source: str | os.PathLike[str] | BinaryIO,
    *,
    as_arrow: bool = False,
    columns: list[str] | None = None,
) -> pd.DataFrame | pa.Table:
    """Read a dataset: a pandas DataFrame, or an Arrow table with `as_arrow=True`."""
    source = os.fspath(source) if isinstance(source, (str, os.PathLike)) else source
    table = pq.read_table(source, columns=columns, schema=None)
    _check_kind(kind, table.schema, source)
    return table if as_arrow else table.to_pandas()


def iter_rows(
    kind: str, source: str | os.PathLike[str] | BinaryIO, batch_size: int = DEFAULT_ROW_GROUP
) -> Iterator[dict[str, Any]]:
    """Stream a dataset's rows as dicts, one batch in memory at a time."""
    source = os.fspath(source) if isinstance(source, (str, os.PathLike)) else source
    parquet_file = pq.ParquetFile(source)
    _check_kind(kind, parquet_file.schema_arrow, source)
    for batch in parquet_file.iter_batches(batch_size=batch_size):
        yield from batch.to_pylist()


def iter_trajectories(
    source: str | os.PathLike[str] | BinaryIO, kind: str = "trajectories"
) -> Iterator[Trajectory]:
    """Stream the Trajectory objects of a `trajectories` (or `compressed`) dataset."""
    for row in iter_rows(kind, source):
        yield row_to_trajectory(row)


def _fetch_dataset(store: ArtifactStore, digest: str, kind: str, folder: str) -> Path:
    """The object copied to a local file (verified), refused unless it is a `kind` dataset: an error
    naming the object, for a manifest that points at another dataset."""
    path = store.get_file(digest, Path(folder) / f"{kind}.parquet")
    try:
        schema = pq.read_schema(path)
    except pa.ArrowException as exc:
        raise ValueError(f"object {digest} is not a Parquet file ({exc})") from None
    try:
        _check_kind(kind, schema, f"object {digest}")
    except ValueError as exc:
        raise ValueError(f"{exc}: the manifest that names it for {kind!r} is damaged; run again with --force on "
                         f"the stage that wrote it") from None
    return path


def read_dataset_from_store(
    store: ArtifactStore, digest: str, kind: str, *, as_arrow: bool = False, columns: list[str] | None = None
) -> pd.DataFrame | pa.Table:
    """Read a dataset object (verified against its digest) from the store."""
    with tempfile.TemporaryDirectory(prefix="race-parquet-") as tmpdir:
        path = _fetch_dataset(store, digest, kind, tmpdir)
        table = read_dataset(kind, path, as_arrow=True, columns=columns)
    return table if as_arrow else table.to_pandas()


def write_from_store(store: ArtifactStore, kind: str, digests: Sequence[str], dest: str | Path) -> int:
    """Stream the rows of several `kind` dataset objects, in order, into one Parquet file at `dest`;
    returns the row count."""
    with DatasetWriter(kind, dest) as writer:
        for digest in digests:
            writer.write_many(iter_rows_from_store(store, digest, kind))
    return writer.rows


def iter_rows_from_store(
    store: ArtifactStore, digest: str, kind: str, batch_size: int = DEFAULT_ROW_GROUP
) -> Iterator[dict[str, Any]]:
    """Stream a dataset object's rows (fetched to a verified local temp file first)."""
    with tempfile.TemporaryDirectory(prefix="race-parquet-") as tmpdir:
        path = _fetch_dataset(store, digest, kind, tmpdir)
        yield from iter_rows(kind, path, batch_size)
