"""The executor seam: stages declare units (`tasks.units`), executors run them (`tasks.executors`).
A job travels to another process as (kind, spec) and names its model by a store object, fetched
once per worker host; the stage modules never import Prefect nor ask which executor runs them;
units whose executor spent their tries are not retried by the task. Real tiny model, real store."""

import re
from pathlib import Path

import pytest

from race_core.config import CoverConfig, PipelineConfig, Resources, RLConfig
from storage import ArtifactStore
from tasks.executors import EXECUTORS, LocalExecutor, UnitsFailed, executor_for, executor_name
from tasks.policy_ref import STORED_STAGE, PolicyRef
from tasks.shards import CoverJob, shard_scope
from tasks.units import UNIT_KINDS, job_from_spec

REPO = Path(__file__).resolve().parents[1]


def test_a_job_rebuilt_from_its_spec_keys_its_units_as_the_submitting_run(tiny_checkpoint):
    policy = PolicyRef.local(tiny_checkpoint)
    resources = Resources(executor="ray", shard_size=3)
    job = CoverJob("a" * 64, policy, CoverConfig(epsilon=0.002), resources,
                   shard_scope(CoverConfig(epsilon=0.002), resources, policy.digest))
    again = job_from_spec(job.kind, job.spec())
    assert (again.scope, again.config, again.resources, again.policy) == (job.scope, job.config, resources, policy)
    other = {**job.spec(), "scope": "0" * 64}  # a worker whose code or libraries key otherwise
    with pytest.raises(ValueError, match="scope mismatch"):
        job_from_spec(job.kind, other)
    with pytest.raises(ValueError, match="unknown unit kind 'nope'"):
        job_from_spec("nope", {})
    with pytest.raises(ValueError, match="--executor local"):  # a scorer object cannot travel
        CoverJob("a" * 64, policy, CoverConfig(), resources, job.scope, make_scorer=lambda: None).spec()


def test_a_portable_job_names_its_model_by_a_store_object_fetched_once_per_host(tiny_checkpoint, tmp_path,
                                                                                monkeypatch):
    store = ArtifactStore(tmp_path / "store")
    local = PolicyRef.local(tiny_checkpoint)
    stored = local.stored(store)
    assert stored.path is None and stored.digest == local.digest and store.has_object(stored.folder)
    assert store.read_manifest(STORED_STAGE, local.digest)["objects"]["checkpoint"] == stored.folder
    assert local.stored(store) == stored  # recorded: not put again

    monkeypatch.setenv("RACE_CHECKPOINT_CACHE", str(tmp_path / "host-a"))
    fetched = Path(stored.local_path(store))
    assert fetched == tmp_path / "host-a" / stored.folder and (fetched / "config.json").exists()
    for digest in store.read_tree(stored.folder).values():  # the store loses the files: the cache serves
        store.fs.rm(store.object_path(digest))
    assert Path(stored.local_path(store)) == fetched
    monkeypatch.setenv("RACE_CHECKPOINT_CACHE", str(tmp_path / "host-b"))
    with pytest.raises(FileNotFoundError):  # another host fetches from the store (now missing)
        stored.local_path(store)


def test_units_whose_executor_spent_their_tries_are_not_retried_by_the_task():
    from types import SimpleNamespace

    from tasks.pipeline_tasks import worth_retrying

    assert not worth_retrying(None, None, SimpleNamespace(data=UnitsFailed("shards [3] failed 3 times")))
    assert worth_retrying(None, None, SimpleNamespace(data=ConnectionError("store away")))


def test_the_executor_is_chosen_by_name():
    assert executor_name(Resources()) == "local" and isinstance(executor_for(Resources()), LocalExecutor)
    assert executor_name(Resources(pool="race-gpu")) == "pool"  # --pool alone, as before
    assert executor_name(Resources(executor="ray", pool="race-gpu")) == "ray"
    assert set(EXECUTORS) == {"local", "pool", "ray"} and set(UNIT_KINDS) == {"cover-shard", "sample-chunk"}
    with pytest.raises(ValueError, match="resources.executor"):
        executor_for(Resources(executor="slurm"))
    base = PipelineConfig(inputs=("x.jsonl",), checkpoint=str(REPO))
    for resources, message in ((Resources(executor="pool"), "needs the work pool's name"),
                               (Resources(executor="dask"), "is not one of"),
                               (Resources(pickup_timeout=0), "resources.pickup_timeout")):
        with pytest.raises(ValueError, match=message):
            PipelineConfig(**{**base.__dict__, "resources": resources}).check()


@pytest.mark.parametrize("module", ["tasks/stages.py", "tasks/shards.py", "tasks/chunks.py", "tasks/units.py",
                                    "tasks/base.py", "tasks/training_stages.py", "tasks/declarations.py"])
def test_stages_know_nothing_of_prefect_nor_of_their_executor(module):
    text = (REPO / module).read_text()
    assert not re.search(r"^\s*(from|import) prefect", text, re.M)
    assert not re.search(r"resources\.(pool|executor|ray_address)\b", text)  # no branch on where units run
    assert "tasks.executors." not in text


def test_the_local_executor_does_each_unit_with_one_worker(smoke_policy, tmp_path, monkeypatch):
    """Two chunks, one policy load: the worker keeps its model across units."""
    from tasks.chunks import SampleJob, chunk_committed
    from tasks.training_stages import sample_scope

    store, policy = ArtifactStore(tmp_path / "store"), PolicyRef.local(smoke_policy)
    config = RLConfig(tasks_per_iteration=2, group_size=1, sample_chunk=1, max_new_tokens=16, max_turns=2)
    job = SampleJob(policy, config, Resources(), 0, sample_scope(policy, config, Resources(), 0))
    loads = []
    original = PolicyRef.load

    def counted(self, *args):
        loads.append(self.digest)
        return original(self, *args)

    monkeypatch.setattr(PolicyRef, "load", counted)
    LocalExecutor().run(job, [{"index": 0}, {"index": 1}], store, Resources())
    assert len(loads) == 1 and all(chunk_committed(store, job.scope, c) for c in (0, 1))


def test_every_stage_is_declared_once_and_its_declaration_is_what_the_pipeline_runs():
    import inspect
    from dataclasses import fields

    from race_core.config import STAGES as NAMES
    from race_core.config import PipelineConfig
    from tasks import fingerprints, pipeline_tasks
    from tasks.declarations import ENTRY_OPTIONS, STAGES
    from tasks.units import UNIT_KINDS

    assert set(NAMES) <= set(STAGES)  # every stage a run can select (arm: the ablation's)
    sections = {f.name for f in fields(PipelineConfig)}
    for name, stage in STAGES.items():
        entry = inspect.signature(stage.function())
        takes = [p.name for p in entry.parameters.values() if p.kind is p.KEYWORD_ONLY]
        # the entry takes exactly what its declaration names, by keyword, and the options every entry takes
        assert set(takes) == {*stage.arguments, *ENTRY_OPTIONS, *(("on_progress",) if stage.progress else ())}, name
        assert list(entry.parameters)[0] == "store"
        assert {stage.config or "ingest", *stage.reads} <= sections and stage.units in (None, *UNIT_KINDS)
        if stage.key is not None:
            assert fingerprints.stage_code(name, {})["source"]  # its sources exist
        made = pipeline_tasks.stage_task(name)
        assert made is pipeline_tasks.stage_task(name)  # one task per stage and process
        assert made.name == name and ("gpu" in made.tags) == stage.gpu and made.retries == (
            pipeline_tasks.RETRIES if stage.key is not None else 0)
    assert pipeline_tasks.stage_task("cover").tags == {"gpu"} and pipeline_tasks.stage_task("validate").retries == 0
    with pytest.raises(TypeError, match=r"stage 'cover': missing \['policy'\]; unknown \['epsilon'\]"):
        STAGES["cover"].check_arguments({"trajectories", "config", "resources", "epsilon"})
