"""The store never leaves a user stuck or serves a stale result (issue 15): each fault injected for
real (a flipped byte on disk, a deleted object, an old uncommitted object, two processes appending
at once), asserting what the user gets."""

from __future__ import annotations

import json
import multiprocessing
import os
import shutil
import time
from pathlib import Path

import pandas as pd
import pytest

from flows.cli import main
from storage.catalog import Catalog, Scope
from storage.gc import collect_garbage
from storage.store import ArtifactStore
from tasks.stages import StageNotRun, run_stage

HOURS = 3600


# -- race cover on a damaged store -------------------------------------------------------------
@pytest.fixture(scope="module")
def covered(tmp_path_factory, tiny_checkpoint):
    """One `race cover` run (home with its store, output, summary), copied by each test."""
    root = tmp_path_factory.mktemp("covered")
    args = _cover_args(root, tiny_checkpoint)
    assert main(args) == 0
    return root, tiny_checkpoint


def _cover_args(root: Path, checkpoint: Path, *extra: str) -> list[str]:
    return ["cover", "--checkpoint", str(checkpoint), "--out", str(root / "out"), "--home", str(root / "home"),
            "--epsilon", "0.002", *extra]


def _copy(covered, tmp_path: Path) -> tuple[Path, ArtifactStore, dict]:
    source, _ = covered
    shutil.copytree(source / "home", tmp_path / "home")
    store = ArtifactStore(tmp_path / "home" / "store")
    cover_key = store.list_manifests("cover")[0]
    return tmp_path, store, store.read_manifest("cover", cover_key)


def _rerun(covered, root: Path, capsys, *extra: str) -> tuple[dict, str]:
    capsys.readouterr()
    assert main(_cover_args(root, covered[1], *extra)) == 0
    captured = capsys.readouterr()
    assert "Traceback" not in captured.err
    return json.loads(captured.out), captured.err


def _decisions(root: Path) -> pd.DataFrame:
    return pd.read_parquet(root / "out" / "decisions.parquet")


def test_a_flipped_byte_in_the_decisions_is_recomputed_by_the_next_race_cover(covered, tmp_path, capsys):
    root, store, cover = _copy(covered, tmp_path)
    decisions = cover["objects"]["decisions"]
    path = Path(store.object_path(decisions))
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0x01  # same size: only reading the digest can tell
    path.write_bytes(bytes(data))

    summary, err = _rerun(covered, root, capsys)
    assert f"object {decisions} is corrupt" in err
    assert summary["stages"]["cover"]["cached"] is False and summary["stages"]["ingest"]["cached"] is True
    assert store.verify_object(decisions)  # recomputed: the same bytes again
    assert (root / "home" / "store" / "quarantine" / decisions).read_bytes() == bytes(data)
    pd.testing.assert_frame_equal(_decisions(root), _decisions(covered[0]))
    again, _ = _rerun(covered, root, capsys)
    assert all(stage["cached"] for stage in again["stages"].values())


def test_a_truncated_parquet_object_is_recomputed_by_the_next_race_cover(covered, tmp_path, capsys):
    root, store, cover = _copy(covered, tmp_path)
    decisions = cover["objects"]["decisions"]
    path = Path(store.object_path(decisions))
    whole = path.read_bytes()
    path.write_bytes(whole[: len(whole) // 2])  # a copy cut off: no Parquet footer
    summary, err = _rerun(covered, root, capsys)
    assert f"cover: recomputing (object {decisions} holds {len(whole) // 2} bytes, not the {len(whole)} recorded)" in err
    assert summary["stages"]["cover"]["cached"] is False and summary["stages"]["ingest"]["cached"] is True
    assert path.read_bytes() == whole
    pd.testing.assert_frame_equal(_decisions(root), _decisions(covered[0]))


def _other_decisions_parquet(size: int) -> bytes:
    """A valid `decisions` Parquet file of exactly `size` bytes that is not the stored one: one row,
    uncompressed, its render_mode padded (each character adds one byte but at a few varint steps)."""
    import io

    import pyarrow as pa
    import pyarrow.parquet as pq

    from storage.parquet import DECISIONS_SCHEMA

    row = {"trajectory_id": "t" * 64, "turn": 1, "accepted": True, "reason": None, "skipped_empty": False,
           "drops": [0.0], "max_drop": 0.0, "reasoning_tokens": 1, "action_tokens": 1, "epsilon": 0.002,
           "model_digest": "m" * 64, "backend": "hf", "render_mode": ""}
    for rows in range(1, 20):
        for pad in range(size):
            table = pa.Table.from_pylist([{**row, "render_mode": "x" * pad}] * rows, schema=DECISIONS_SCHEMA)
            sink = io.BytesIO()
            pq.write_table(table, sink, compression="none", write_statistics=False)
            if len(sink.getvalue()) == size:
                return sink.getvalue()
            if len(sink.getvalue()) > size:
                break
    raise AssertionError(f"no decisions file of {size} bytes")


def test_an_object_replaced_by_another_valid_parquet_file_of_the_same_size_is_caught_by_its_digest(
        covered, tmp_path, capsys):
    root, store, cover = _copy(covered, tmp_path)
    decisions = cover["objects"]["decisions"]
    path = Path(store.object_path(decisions))
    other = _other_decisions_parquet(path.stat().st_size)
    path.write_bytes(other)  # the size check passes: only the digest can tell
    assert store.manifest_damage(cover) is None
    summary, err = _rerun(covered, root, capsys)
    assert f"object {decisions} is corrupt" in err
    assert (root / "home" / "store" / "quarantine" / decisions).read_bytes() == other
    assert summary["stages"]["cover"]["cached"] is False
    pd.testing.assert_frame_equal(_decisions(root), _decisions(covered[0]))


def test_a_manifest_naming_another_valid_parquet_object_stops_in_one_line_and_force_repairs_it(
        covered, tmp_path, capsys):
    root, store, cover = _copy(covered, tmp_path)
    (ingest_key,) = store.list_manifests("ingest")
    ingest = store.read_manifest("ingest", ingest_key)
    wrong = ingest["objects"]["rejects"]  # a valid Parquet object of the store, but the ingest's rejects
    damaged = {**cover, "objects": {**cover["objects"], "decisions": wrong}}
    damaged["object_sizes"] = {**cover["object_sizes"], wrong: Path(store.object_path(wrong)).stat().st_size}
    Path(store.manifest_path("cover", cover["key"])).write_text(json.dumps(damaged))

    capsys.readouterr()
    assert main(_cover_args(root, covered[1])) == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err
    line = err.strip().splitlines()[-1]
    assert line.startswith("race cover: error: ") and f"object {wrong} holds a 'rejects' dataset, not 'decisions'" in line
    assert "--force" in line

    summary, _ = _rerun(covered, root, capsys, "--force", "cover")
    assert summary["stages"]["cover"]["cached"] is False
    assert summary["objects"]["decisions"] == cover["objects"]["decisions"]
    pd.testing.assert_frame_equal(_decisions(root), _decisions(covered[0]))


def test_a_deleted_object_makes_its_stage_run_again(covered, tmp_path, capsys):
    root, store, cover = _copy(covered, tmp_path)
    os.unlink(store.object_path(cover["objects"]["decisions"]))
    summary, err = _rerun(covered, root, capsys)
    assert f"cover: recomputing (object {cover['objects']['decisions']} is missing)" in err
    assert summary["stages"]["cover"]["cached"] is False
    assert summary["stages"]["ingest"]["cached"] is True and summary["stages"]["compress"]["cached"] is True
    pd.testing.assert_frame_equal(_decisions(root), _decisions(covered[0]))


def test_force_cover_recomputes_a_valid_stage(covered, tmp_path, capsys):
    root, _, _ = _copy(covered, tmp_path)
    summary, err = _rerun(covered, root, capsys, "--force", "cover")
    assert "cover: recomputing (forced)" in err
    assert summary["stages"]["cover"]["cached"] is False
    assert summary["stages"]["ingest"]["cached"] is True and summary["stages"]["compress"]["cached"] is True


def test_force_names_only_stages(covered, tmp_path, capsys):
    root, _, _ = _copy(covered, tmp_path)
    assert main(_cover_args(root, covered[1], "--force", "sft")) == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err and "'sft'" in err and len(err.strip().splitlines()) == 1


def test_a_corrupt_object_reaches_the_user_as_one_line(covered, tmp_path, capsys):
    root, store, cover = _copy(covered, tmp_path)
    decisions = cover["objects"]["decisions"]
    Path(store.object_path(decisions)).write_bytes(b"not the decisions")
    summary = root / "summary.json"
    summary.write_text(json.dumps({"objects": {"decisions": decisions}, "run": {"store": store.url}}))
    capsys.readouterr()
    assert main(["report", "--summary", str(summary), "--out", str(root / "report")]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("race report: error: object ") and "\n" not in err and "quarantine" in err


def test_a_stage_left_out_whose_output_is_damaged_fails_naming_it(tmp_path):
    store = ArtifactStore(tmp_path / "store")

    def compute() -> dict:
        return {"objects": {"report": store.put_bytes(b"evaluation")}}

    manifest = run_stage(store, "evaluate", {}, {}, None, compute)
    os.unlink(store.object_path(manifest["objects"]["report"]))
    with pytest.raises(StageNotRun, match="'evaluate' was not selected and its stored output is damaged"):
        run_stage(store, "evaluate", {}, {}, None, compute, only_cached=True)
    assert run_stage(store, "evaluate", {}, {}, None, compute)["cached"] is False  # selected: recomputed


def test_race_run_force_reaches_the_named_stage_only():
    from flows.cli import build_parser
    from flows.options import config_from_args
    from flows.run import PipelineRun
    from race_core.config import PipelineConfig

    args = build_parser().parse_args(["run", "--input", "a.jsonl", "--checkpoint", "/m", "--stages", "compress",
                                      "--force", "cover"])
    config = config_from_args(PipelineConfig(), args)
    assert config.force == ("cover",)
    calls: list[tuple[str, dict]] = []
    OPTIONS = ("force", "only_cached")

    class RecordingTask:  # a stand-in for a stage's task: records how the run calls it, runs nothing
        def __init__(self, name: str):
            self.name = name

        def __call__(self, store: str, **kwargs):
            calls.append((self.name, {k: v for k, v in kwargs.items() if k in OPTIONS}))
            seen[self.name] = kwargs
            return {"cached": False}

        def fn(self, store: str, **kwargs):
            calls.append((self.name + ".fn", {k: v for k, v in kwargs.items() if k in OPTIONS}))
            return {"cached": True}

    seen: dict[str, dict] = {}
    run = PipelineRun(config, task_for=RecordingTask)
    ingested = run.stage("ingest", inputs=["a.jsonl"])
    run.stage("validate", ingested=ingested)
    decided = run.stage("cover", trajectories=ingested, policy="p")
    compressed = run.stage("compress", trajectories=ingested, decided=decided, policy="p")
    assert run.stage("sft", compressed=compressed, base="p") is None  # neither selected nor needed
    assert calls == [("ingest.fn", {"only_cached": True}), ("cover", {"force": True}), ("compress", {})]
    # each stage is handed the config sections its declaration reads, from the run's config
    assert seen["cover"]["config"] is config.cover and seen["cover"]["resources"] is config.resources
    assert seen["compress"]["config"] is config.cover and "resources" not in seen["compress"]
    with pytest.raises(TypeError, match=r"stage 'compress': missing \['decided'\]"):  # before anything runs
        run.stage("compress", trajectories=ingested, policy="p")
    with pytest.raises(ValueError, match="parameter 'force': unknown \\['scoring'\\]"):
        PipelineConfig(inputs=("x.jsonl",), force=("scoring",)).check()


# -- gc and running stages ---------------------------------------------------------------------
def _age(path: str, hours: float) -> None:
    then = time.time() - hours * HOURS
    os.utime(path, (then, then))


def test_gc_keeps_a_fresh_uncommitted_object_and_removes_an_old_one(tmp_path, capsys):
    store = ArtifactStore(tmp_path / "store")
    fresh = store.put_bytes(b"written by a stage that has not committed yet")
    old = store.put_bytes(b"left by a run killed yesterday")
    _age(store.object_path(old), 7)
    fresh_tmp, old_tmp = (Path(store.object_path(fresh)).parent / name for name in (".tmp-a-x", ".tmp-b-y"))
    fresh_tmp.write_bytes(b"upload in progress")
    old_tmp.write_bytes(b"abandoned")
    _age(str(old_tmp), 7)

    assert main(["gc", "--store", store.url, "--delete"]) == 0
    out = capsys.readouterr().out
    assert f"removed: 1 unreferenced object(s) older than 6 h\n  {old}" in out
    assert "removed: 1 abandoned temp file(s) older than 6 h" in out
    assert "kept: 1 unreferenced object(s) younger than 6 h" in out
    assert store.has_object(fresh) and not store.has_object(old)
    assert fresh_tmp.exists() and not old_tmp.exists()
    assert main(["gc", "--store", store.url, "--grace-hours", "0"]) == 0
    assert f"would remove (dry run; --delete to remove): 1 unreferenced object(s) older than 0 h\n  {fresh}" in (
        capsys.readouterr().out)


def test_reusing_an_old_unreferenced_object_protects_it_from_gc(tmp_path):
    store = ArtifactStore(tmp_path / "store")
    digest = store.put_bytes(b"the same decisions as a run killed yesterday")
    _age(store.object_path(digest), 7)
    assert collect_garbage(store).objects == [digest]
    assert store.put_bytes(b"the same decisions as a run killed yesterday") == digest  # a rerun reuses it
    report = collect_garbage(store, dry_run=False)
    assert report.objects == [] and report.young == [digest] and store.has_object(digest)


# -- the catalog under concurrent appends ------------------------------------------------------
SCOPE = Scope("a" * 64, 1e-3, {"backend": "hf"})
PARTS_PER_WRITER = 40


def _append_parts(root: str, writer: str, start, count: int) -> None:
    store = ArtifactStore(root)
    catalog = Catalog(store)
    start.wait()
    for i in range(count):
        part = store.put_bytes(f"{writer}-{i}".encode())
        catalog.append_part(SCOPE, part, [f"{writer}-{i}", "shared-id"])


def test_two_processes_appending_at_once_never_share_a_number_or_lose_a_part(tmp_path):
    root = str(tmp_path / "store")
    ctx = multiprocessing.get_context("spawn")
    start = ctx.Event()
    writers = [ctx.Process(target=_append_parts, args=(root, name, start, PARTS_PER_WRITER)) for name in "ab"]
    for process in writers:
        process.start()
    start.set()
    for process in writers:
        process.join(timeout=300)
        assert process.exitcode == 0
    store = ArtifactStore(root)
    names = store.list_records(f"catalog/{SCOPE.key}")
    assert names == [f"{seq:08d}.json" for seq in range(1, 2 * PARTS_PER_WRITER + 1)]  # no gap, no repeat
    parts = Catalog(store).parts(SCOPE)
    expected = {store.put_bytes(f"{w}-{i}".encode()) for w in "ab" for i in range(PARTS_PER_WRITER)}
    assert {p["part"] for p in parts} == expected and len(parts) == len(expected)
    assert [p["seq"] for p in parts] == list(range(1, 2 * PARTS_PER_WRITER + 1))
    assert not [p for p in (tmp_path / "store").rglob(".tmp-*")]


def test_a_reader_counts_an_id_in_two_parts_once(tmp_path):
    store = ArtifactStore(tmp_path / "store")
    catalog = Catalog(store)
    first, second = store.put_bytes(b"part A"), store.put_bytes(b"part A+B")
    entry = catalog.append_part(SCOPE, first, ["t1", "t2"])
    catalog.append_part(SCOPE, second, ["t1", "t2", "t3"])  # two nightly runs that overlapped
    # and the same part recorded twice, as racing writers of the old check-then-write layout did
    store.write_record(f"catalog/{SCOPE.key}/00000002-{first}.json", {**entry, "seq": 2}, overwrite=False)
    assert [p["part"] for p in catalog.parts(SCOPE)] == [first, second]
    assert catalog.owners(SCOPE) == {"t1": first, "t2": first, "t3": second}
    assert catalog.compressed_ids(SCOPE) == {"t1", "t2", "t3"}
    assert catalog.new_ids(SCOPE, ["t3", "t4", "t1"]) == ["t4"]
    third = store.put_bytes(b"part C")
    assert catalog.append_part(SCOPE, third, ["t4"])["seq"] == 3  # numbers after both old names
