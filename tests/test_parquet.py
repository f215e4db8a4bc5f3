"""Parquet datasets: declared schemas on disk, round trips of hard values, streaming row groups."""

from __future__ import annotations

import io

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from race_core.schema import Reject, Trajectory, Turn
from storage.parquet import (
    SCHEMAS,
    DatasetWriter,
    compressed_row,
    iter_rows,
    iter_rows_from_store,
    iter_trajectories,
    read_dataset,
    read_dataset_from_store,
    row_to_trajectory,
    trajectory_row,
    write_dataset,
    write_dataset_to_store,
)
from storage.store import ArtifactStore, CorruptObjectError

BIG = "λ" * (1 << 20)  # a 1M-character (2 MB UTF-8) field
UNICODE = "漢字 — émoji 🚀 \u0000 nul and \u200b zero-width"
MODEL = "d" * 64


def _trajectory(
    question: str, reasoning: str, observation: str = "", extra: dict | None = None
) -> Trajectory:
    return Trajectory(
        question=question,
        environment="calculator",
        source_revision="rev-1",
        turns=(
            Turn(reasoning=reasoning, action="calc(1+1)", observation=observation),
            Turn(reasoning="", action="answer(2)", observation=""),
        ),
        extra=extra or {},
    )


TRAJECTORIES = [
    _trajectory("plain question", "think"),
    _trajectory(UNICODE, UNICODE, UNICODE, extra={"source_id": "ü-1", "tags": ["a", "b"]}),
    _trajectory("empty reasoning", "", ""),
    _trajectory("big field", BIG, BIG[:10]),
]


def _rows(kind: str) -> list[dict]:
    if kind == "trajectories":
        return [trajectory_row(t) for t in TRAJECTORIES]
    if kind == "compressed":
        return [compressed_row(t, [0], 10, 4, MODEL, 1e-3) for t in TRAJECTORIES[:-1]] + [
            compressed_row(TRAJECTORIES[-1], [], 0, 0, MODEL, 1e-3)
        ]
    if kind == "episodes":  # played episodes: a trajectory's columns and what the player recorded per turn
        return [{**trajectory_row(t), "task_id": t.id, "sample_index": i, "reward": float(t.successful) - 0.5 * i,
                 "finished": i != 1, "well_formed": [i != 2] * len(t.turns), "reasoning_tokens": [i] * len(t.turns),
                 "generated_tokens": 2**40 + i, "policy_digest": MODEL if i else UNICODE}
                for i, t in enumerate(TRAJECTORIES)]
    if kind == "rejects":
        return [
            Reject("in.jsonl", 1, "not_json", "<line>", UNICODE).to_dict(),
            Reject("", 2, "empty_field", "", "").to_dict(),
            Reject("ß.jsonl", 2**40, "field_too_large", "question", BIG).to_dict(),
            Reject("", 0, "too_long", "turns", "renders to 9000 tokens", trajectory_id=UNICODE).to_dict(),
        ]
    return [
        _decision("t1", 0, accepted=True, drops=[0.0, -1e-4], max_drop=0.0),
        _decision(UNICODE, 1, accepted=False, drops=[0.5], max_drop=0.5, backend=BIG),
        _decision("", 2, accepted=False, drops=[], max_drop=None, skipped_empty=True),
    ]


def _decision(tid, turn, *, accepted, drops, max_drop, skipped_empty=False, backend="hf") -> dict:
    return {
        "trajectory_id": tid,
        "turn": turn,
        "accepted": accepted,
        "reason": None if accepted else "empty_reasoning" if skipped_empty else "over_epsilon",
        "skipped_empty": skipped_empty,
        "drops": drops,
        "max_drop": max_drop,
        "reasoning_tokens": 12,
        "action_tokens": 5,
        "epsilon": 1e-3,
        "model_digest": MODEL,
        "backend": backend,
        "render_mode": "canonical/keeps-reasoning",
    }


@pytest.mark.parametrize("kind", sorted(SCHEMAS))
def test_every_schema_round_trips_unicode_empty_and_1mb_fields(kind, tmp_path):
    rows = _rows(kind)
    path = tmp_path / f"{kind}.parquet"
    assert write_dataset(kind, rows, path) == len(rows)
    assert pq.read_schema(path).equals(SCHEMAS[kind], check_metadata=False)
    assert pq.read_schema(path).metadata[b"race.dataset"] == kind.encode()
    assert read_dataset(kind, path, as_arrow=True).to_pylist() == rows
    assert list(iter_rows(kind, path)) == rows
    frame = read_dataset(kind, path)
    assert len(frame) == len(rows) and list(frame.columns) == SCHEMAS[kind].names


@pytest.mark.parametrize("kind", ["trajectories", "compressed"])
def test_trajectories_come_back_as_equal_objects(kind, tmp_path):
    path = tmp_path / f"{kind}.parquet"
    write_dataset(kind, _rows(kind), path)
    assert list(iter_trajectories(path, kind)) == TRAJECTORIES
    frame = read_dataset(kind, path)  # pandas rows hold numpy arrays; still convertible
    assert [row_to_trajectory(r) for r in frame.to_dict("records")] == TRAJECTORIES


def test_trajectory_objects_and_rejects_are_accepted_directly(tmp_path):
    path = tmp_path / "t.parquet"
    assert write_dataset("trajectories", TRAJECTORIES, path) == len(TRAJECTORIES)
    assert [r["id"] for r in iter_rows("trajectories", path)] == [t.id for t in TRAJECTORIES]
    rejects = [Reject("a.jsonl", 3, "bad_split", "split", "must be 'train'")]
    write_dataset("rejects", rejects, tmp_path / "r.parquet")
    assert list(iter_rows("rejects", tmp_path / "r.parquet")) == [rejects[0].to_dict()]


def test_empty_dataset_has_the_schema_and_no_rows(tmp_path):
    path = tmp_path / "empty.parquet"
    assert write_dataset("decisions", [], path) == 0
    assert pq.read_schema(path).equals(SCHEMAS["decisions"], check_metadata=False)
    assert read_dataset("decisions", path, as_arrow=True).num_rows == 0


def test_missing_column_is_refused_by_name(tmp_path):
    row = _rows("decisions")[0]
    del row["backend"]
    path = tmp_path / "d.parquet"
    with pytest.raises(ValueError, match="backend"):
        write_dataset("decisions", [row], path)
    assert not path.exists()  # the failed write left nothing under the final name
    assert list(tmp_path.iterdir()) == []


def test_reading_a_dataset_as_the_wrong_kind_is_refused(tmp_path):
    path = tmp_path / "r.parquet"
    write_dataset("rejects", _rows("rejects"), path)
    with pytest.raises(ValueError, match="rejects"):
        read_dataset("decisions", path)


def test_writer_streams_in_row_groups(tmp_path):
    path = tmp_path / "d.parquet"
    base = _rows("decisions")[0]
    with DatasetWriter("decisions", path, row_group_size=100) as writer:
        for i in range(1050):
            writer.write({**base, "turn": i})
    assert writer.rows == 1050
    meta = pq.ParquetFile(path).metadata
    assert meta.num_row_groups == 11 and meta.num_rows == 1050
    assert [r["turn"] for r in iter_rows("decisions", path, batch_size=64)] == list(range(1050))


def test_writer_accepts_a_file_like_sink():
    sink = io.BytesIO()
    assert write_dataset("rejects", _rows("rejects"), sink) == len(_rows("rejects"))
    table = pq.read_table(pa.BufferReader(sink.getvalue()))
    assert table.to_pylist() == _rows("rejects")


def test_dataset_object_in_the_store_round_trips_and_is_verified(tmp_path):
    store = ArtifactStore(str(tmp_path / "store"))
    digest, count = write_dataset_to_store(store, "compressed", _rows("compressed"))
    assert count == len(TRAJECTORIES)
    assert write_dataset_to_store(store, "compressed", _rows("compressed"))[0] == digest  # deterministic
    table = read_dataset_from_store(store, digest, "compressed", as_arrow=True)
    assert table.to_pylist() == _rows("compressed")
    assert [r["id"] for r in iter_rows_from_store(store, digest, "compressed")] == [
        t.id for t in TRAJECTORIES
    ]
    store.fs.pipe_file(store.object_path(digest), b"PAR1 not really")
    with pytest.raises(CorruptObjectError, match=digest):
        read_dataset_from_store(store, digest, "compressed")
