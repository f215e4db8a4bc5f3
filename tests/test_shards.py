"""The shard as the cover's unit of work (issue 16): one manifest per shard, keyed by content; a
failed run resumes at the first shard without a manifest; a changed shard size scores nothing
already decided; a second writer of a shard is dropped. Real tiny model, real store and Parquet."""

import pytest

from race_core.config import CoverConfig, Resources
from race_core.policy import checkpoint_digest
from race_core.scoring import make_scorer
from storage import ArtifactStore, read_dataset_from_store
from tasks import shards, stages


class Recording:
    """The real scorer, recording which trajectories it scored; with `fail_on_shard` it raises when
    a trajectory of that shard is scored (a fault injected on purpose)."""

    def __init__(self, checkpoint, fail_ids=frozenset()):
        self.inner = make_scorer("hf", str(checkpoint))
        self.fail_ids = fail_ids
        self.scored: set[str] = set()

    def score(self, requests):
        ids = {r.trajectory.id for r in requests}
        if ids & self.fail_ids:
            raise RuntimeError("injected fault: the device went away")
        self.scored |= ids
        return self.inner.score(requests)

    def __getattr__(self, name):
        return getattr(self.inner, name)


@pytest.fixture
def ingested(tmp_path, demo_inputs, tiny_checkpoint):
    store = ArtifactStore(tmp_path / "store")
    manifest = stages.ingest(store, demo_inputs)
    return store, manifest["objects"]["trajectories"], str(tiny_checkpoint), checkpoint_digest(tiny_checkpoint)


def _cover(store, trajectories, checkpoint, digest, size, scorer):
    return stages.cover(store, trajectories, checkpoint, digest, CoverConfig(), Resources(shard_size=size),
                        scorer_factory=lambda: scorer)


def _rows(store, manifest):
    table = read_dataset_from_store(store, manifest["objects"]["decisions"], "decisions")
    return table[["trajectory_id", "turn", "accepted", "reason", "skipped_empty"]]


def test_a_failed_cover_resumes_at_the_first_shard_without_a_manifest(ingested, tiny_checkpoint, tmp_path):
    store, trajectories, checkpoint, digest = ingested
    plan = shards.plan_shards(store, trajectories, 2)
    scope = shards.shard_scope(CoverConfig(), Resources(), digest)
    assert [len(s.ids) for s in plan] == [2, 2, 2, 2]

    failing = Recording(checkpoint, fail_ids=frozenset(plan[2].ids))
    with pytest.raises(RuntimeError, match="injected fault"):
        _cover(store, trajectories, checkpoint, digest, 2, failing)
    assert [shards.committed(store, shards.shard_key(scope, s)) is not None for s in plan] == [True, True, False, False]
    assert store.list_manifests("cover") == []  # the stage itself has not committed

    again = Recording(checkpoint)
    resumed = _cover(store, trajectories, checkpoint, digest, 2, again)
    assert again.scored == set(plan[2].ids) | set(plan[3].ids)  # shards 0 and 1 were not scored again
    assert resumed["metrics"]["shards"] == 4 and resumed["shards"]["scope"] == scope

    clean_store = ArtifactStore(tmp_path / "clean")
    assert stages.ingest(clean_store, _inputs(store))["objects"]["trajectories"] == trajectories
    clean = _cover(clean_store, trajectories, checkpoint, digest, 2, Recording(checkpoint))
    assert resumed["objects"] == clean["objects"]  # the same bytes as a run that never failed


def _inputs(store):
    """The input files of the store's ingest manifest."""
    [key] = store.list_manifests("ingest")
    return [f["file"] for f in store.read_manifest("ingest", key)["files_read"]]


def test_a_changed_shard_size_reuses_a_finished_cover(ingested):
    store, trajectories, checkpoint, digest = ingested
    by_two = _cover(store, trajectories, checkpoint, digest, 2, Recording(checkpoint))
    untouched = Recording(checkpoint)
    by_three = _cover(store, trajectories, checkpoint, digest, 3, untouched)
    # the shard size is not in the stage key: where and how the work was cut does not change it
    assert by_three["cached"] and by_three["objects"] == by_two["objects"] and untouched.scored == set()


def test_a_changed_shard_size_after_a_failure_scores_only_the_undecided(ingested):
    store, trajectories, checkpoint, digest = ingested
    plan = shards.plan_shards(store, trajectories, 2)
    with pytest.raises(RuntimeError, match="injected fault"):
        _cover(store, trajectories, checkpoint, digest, 2, Recording(checkpoint, fail_ids=frozenset(plan[1].ids)))
    decided = set(plan[0].ids)

    resumed = Recording(checkpoint)
    by_four = _cover(store, trajectories, checkpoint, digest, 4, resumed)
    all_ids = {i for s in plan for i in s.ids}
    assert resumed.scored == all_ids - decided
    assert by_four["metrics"]["trajectories_reused"] == 2
    clean = ArtifactStore(store.root + "-clean")
    stages.ingest(clean, _inputs(store))
    reference = _cover(clean, trajectories, checkpoint, digest, 4, Recording(checkpoint))
    assert _rows(store, by_four).equals(_rows(clean, reference))


def test_a_second_writer_of_a_shard_is_dropped(ingested):
    store, trajectories, checkpoint, digest = ingested
    plan = shards.plan_shards(store, trajectories, 4)
    scope = shards.shard_scope(CoverConfig(), Resources(), digest)
    [unit] = shards.shard_units(store, scope, plan[:1], 4, force=False)
    batch, read = shards.read_shard(store, trajectories, unit)
    assert [t.id for t in batch] == list(plan[0].ids)
    key = shards.shard_key(scope, plan[0])

    def writer():
        from race_core.progress import CoverProgress

        return shards.ShardScorer(CoverConfig(), digest, lambda: Recording(checkpoint), CoverProgress(4))

    first = shards._score_and_commit(store, key, plan[0], batch, shards._Reuse(store), writer(), "cpu", read, False)
    committed = store.read_record(shards.manifest_record(key))
    late = shards._score_and_commit(store, key, plan[0], batch, shards._Reuse(store), writer(), "cpu", read, False)
    assert first == (True, 0) and late == (False, 0)
    assert store.read_record(shards.manifest_record(key)) == committed  # the first copy stands


@pytest.fixture
def many(tmp_path):
    """1280 trajectories ingested: 20 row groups of 64 rows (`tasks.base.TRAJECTORY_ROW_GROUP`)."""
    from flows.cover import demo_inputs

    store = ArtifactStore(tmp_path / "store")
    manifest = stages.ingest(store, demo_inputs(tmp_path / "home", n=1280, seed=3))
    return store, manifest["objects"]["trajectories"]


def test_a_shard_reads_only_the_row_groups_that_hold_it(many):
    import pyarrow.parquet as pq

    from tasks.base import TRAJECTORY_ROW_GROUP

    store, trajectories = many
    size = store.fs.size(store.object_path(trajectories))
    groups = pq.ParquetFile(store.object_path(trajectories)).metadata.num_row_groups
    assert groups == 20 and TRAJECTORY_ROW_GROUP == 64
    plan = shards.plan_shards(store, trajectories, 64)
    unit = {"index": 2, "start": 128, "ids": list(plan[2].ids)}
    batch, read = shards.read_shard(store, trajectories, unit)
    every = [t.id for t in stages.iter_trajectories(store, trajectories)]
    assert [t.id for t in batch] == every[128:192]
    # one row group of twenty and the footer (which lists all twenty): well under a quarter of the object
    print(f"shard 2 of 20: {read} of {size} bytes read")
    assert read < size / 4


def test_a_shard_of_a_corrupt_object_names_it_and_quarantines_it(many):
    from storage import CorruptObjectError

    store, trajectories = many
    plan = shards.plan_shards(store, trajectories, 64)
    path = store.object_path(trajectories)
    data = bytearray(open(path, "rb").read())
    middle = len(data) // 2
    data[middle:middle + 64] = bytes(64)  # zero a stretch inside a row group's pages
    open(path, "wb").write(bytes(data))
    units = [{"index": s.index, "start": s.index * 64, "ids": list(s.ids)} for s in plan]
    with pytest.raises(CorruptObjectError, match=trajectories):
        for unit in units:
            shards.read_shard(store, trajectories, unit)
    assert not store.has_object(trajectories)  # moved aside: the next run recomputes ingest


def test_a_shard_whose_rows_are_not_the_planned_ones_is_an_error(many):
    store, trajectories = many
    plan = shards.plan_shards(store, trajectories, 64)
    shifted = {"index": 1, "start": 65, "ids": list(plan[1].ids)}
    with pytest.raises(ValueError, match="not the planned ones"):
        shards.read_shard(store, trajectories, shifted)


def test_a_shard_plan_keyed_by_content_not_position(ingested):
    store, trajectories, _, digest = ingested
    plan = shards.plan_shards(store, trajectories, 3)
    scope = shards.shard_scope(CoverConfig(), Resources(), digest)
    moved = shards.Shard(index=7, ids=plan[0].ids)
    assert shards.shard_key(scope, moved) == shards.shard_key(scope, plan[0])
    assert shards.shard_scope(CoverConfig(epsilon=0.002), Resources(), digest) != scope
    assert shards.shard_scope(CoverConfig(), Resources(shard_size=9, pool="race-gpu"), digest) == scope
    where = Resources(executor="ray", ray_address="10.0.0.1:6379", ray_actors=3, pickup_timeout=5)
    assert shards.shard_scope(CoverConfig(), where, digest) == scope  # where units run is not keyed
    with pytest.raises(ValueError, match="resources.shard_size"):
        shards.plan_shards(store, trajectories, 0)


def test_race_worker_is_a_process_worker_of_the_pool_on_its_device(tmp_path, monkeypatch):
    from flows.worker_cli import worker_command

    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("RACE_CHECKPOINT_CACHE", raising=False)
    argv, env = worker_command("race-gpu", "cuda:1", name="w1")
    assert argv[1:] == ["-m", "prefect", "worker", "start", "--pool", "race-gpu", "--type", "process",
                        "--limit", "1", "--name", "w1"]
    assert env["RACE_DEVICE"] == "cuda:1"
    # child runs start in temporary folders: the checkpoint cache is the worker's folder's, absolute
    assert env["RACE_CHECKPOINT_CACHE"] == str(tmp_path / ".race" / "cache" / "checkpoints")
    with pytest.raises(ValueError, match="--device"):
        worker_command("race-gpu", "gpu1")
