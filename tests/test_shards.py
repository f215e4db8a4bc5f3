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
    shard, batch = next(shards.read_shards(store, trajectories, 4, plan[:1]))
    key = shards.shard_key(scope, shard)

    def writer():
        from race_core.progress import CoverProgress

        return shards.ShardScorer(CoverConfig(), digest, lambda: Recording(checkpoint), CoverProgress(4, log=print))

    first = shards._score_and_commit(store, key, shard, batch, shards._Reuse(store), writer(), "cpu", False)
    committed = store.read_record(shards.manifest_record(key))
    late = shards._score_and_commit(store, key, shard, batch, shards._Reuse(store), writer(), "cpu", False)
    assert first == (True, 0) and late == (False, 0)
    assert store.read_record(shards.manifest_record(key)) == committed  # the first copy stands


def test_a_shard_plan_keyed_by_content_not_position(ingested):
    store, trajectories, _, digest = ingested
    plan = shards.plan_shards(store, trajectories, 3)
    scope = shards.shard_scope(CoverConfig(), Resources(), digest)
    moved = shards.Shard(index=7, ids=plan[0].ids)
    assert shards.shard_key(scope, moved) == shards.shard_key(scope, plan[0])
    assert shards.shard_scope(CoverConfig(epsilon=0.002), Resources(), digest) != scope
    assert shards.shard_scope(CoverConfig(), Resources(shard_size=9, pool="race-gpu"), digest) == scope
    with pytest.raises(ValueError, match="resources.shard_size"):
        shards.plan_shards(store, trajectories, 0)


def test_race_worker_is_a_process_worker_of_the_pool_on_its_device():
    from flows.worker_cli import worker_command

    argv, env = worker_command("race-gpu", "cuda:1", name="w1")
    assert argv[1:] == ["-m", "prefect", "worker", "start", "--pool", "race-gpu", "--type", "process",
                        "--limit", "1", "--name", "w1"]
    assert env["RACE_DEVICE"] == "cuda:1"
    with pytest.raises(ValueError, match="--device"):
        worker_command("race-gpu", "gpu1")
