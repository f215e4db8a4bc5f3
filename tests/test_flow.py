"""The Prefect pipeline on a real temporary server: caching, retries, rejects, nightly."""

import json

import pytest

from flows.nightly import race_nightly
from flows.pipeline import race_pipeline
from race_core.config import COVER_STAGES, CoverConfig, NightlyConfig, PipelineConfig, Resources, replace
from race_core.policy import checkpoint_digest
from race_core.scoring.hf import HFScorer
from storage import ArtifactStore, Catalog, read_dataset_from_store
from tasks import stages


def cover_config(inputs, checkpoint, store, **changes) -> PipelineConfig:
    return replace(PipelineConfig(inputs=tuple(inputs), checkpoint=str(checkpoint), store=str(store),
                                  stages=COVER_STAGES), **changes)


@pytest.fixture
def scored(monkeypatch):
    """A spy on the real scorer: counts the trajectories it is asked to score from turn 0."""
    calls = {"requests": 0, "trajectories": set()}
    real = HFScorer.score

    def spy(self, requests):
        calls["requests"] += len(requests)
        calls["trajectories"].update(r.trajectory.question for r in requests if r.from_turn == 0)
        return real(self, requests)

    monkeypatch.setattr(HFScorer, "score", spy)
    return calls


def test_second_run_on_the_same_inputs_computes_nothing(prefect_harness, tiny_checkpoint, demo_inputs, tmp_path,
                                                         scored):
    config = cover_config(demo_inputs, tiny_checkpoint, tmp_path / "store")
    first = race_pipeline(config)
    assert scored["requests"] > 0
    assert not any(s["cached"] for s in first["stages"].values())
    scored["requests"] = 0
    second = race_pipeline(config)
    assert scored["requests"] == 0
    assert set(second["stages"]) == {"ingest", "cover", "compress"}
    assert all(s["cached"] for s in second["stages"].values())
    assert second["objects"] == first["objects"]


def test_a_stage_that_raises_a_connection_error_once_is_retried(prefect_harness, tiny_checkpoint, demo_inputs,
                                                                 tmp_path, monkeypatch):
    """The flow's reaction to a stage that raises, not a real fault (tests/test_store_*_faults.py
    inject those): the compress stage is replaced by one that raises ConnectionError the first time."""
    real = stages.compress
    attempts = []

    def flaky(*args, **kwargs):
        attempts.append(1)
        if len(attempts) == 1:
            raise ConnectionError("injected: the stage raised")
        return real(*args, **kwargs)

    monkeypatch.setattr(stages, "compress", flaky)
    summary = race_pipeline(cover_config(demo_inputs, tiny_checkpoint, tmp_path / "s"))
    assert len(attempts) == 2
    assert summary["cover"]["candidates"] > 0


def test_a_stage_that_always_raises_fails_the_run_naming_its_task(prefect_harness, tiny_checkpoint, demo_inputs,
                                                                   tmp_path, monkeypatch):
    """The flow's reaction to a stage that raises every time (replaced by a function raising
    RuntimeError), not a real fault: a real full disk is tests/test_store_disk_faults.py's."""
    def broken(*args, **kwargs):
        raise RuntimeError("injected: the cover stage raised")

    monkeypatch.setattr(stages, "cover", broken)
    state = race_pipeline(cover_config(demo_inputs, tiny_checkpoint, tmp_path / "s"), return_state=True)
    assert state.is_failed()
    with pytest.raises(RuntimeError, match="the cover stage raised"):
        state.result()
    from prefect.client.orchestration import get_client

    async def failed_tasks():
        from prefect.client.schemas.filters import FlowRunFilter, FlowRunFilterId

        async with get_client() as client:
            runs = await client.read_task_runs(flow_run_filter=FlowRunFilter(id=FlowRunFilterId(any_=[
                state.state_details.flow_run_id])))
            return {r.name.rsplit("-", 1)[0] for r in runs if r.state.is_failed()}

    import asyncio

    assert asyncio.run(failed_tasks()) == {"cover"}


def test_bad_rows_are_listed_and_strict_stops_before_scoring(prefect_harness, tiny_checkpoint, demo_inputs,
                                                             tmp_path, scored):
    mixed = tmp_path / "mixed.jsonl"
    good = [json.loads(x) for x in open(demo_inputs[0])][:3]
    bad = [{**good[0], "split": "test"}, {**good[1], "successful": False}]
    mixed.write_text("\n".join([json.dumps(good[0]), json.dumps(bad[0]), "{oops", json.dumps(good[1]),
                                json.dumps(bad[1]), json.dumps(good[2])]) + "\n")
    store = str(tmp_path / "store")
    summary = race_pipeline(cover_config([mixed], tiny_checkpoint, store))
    assert summary["trajectories"] == {"ingested": 3, "rejected": 3, "too_long": 0}
    rejects = read_dataset_from_store(ArtifactStore(store), summary["objects"]["rejects"], "rejects")
    assert list(rejects["line"]) == [2, 3, 5]
    assert list(rejects["code"]) == ["bad_split", "not_json", "not_successful"]
    scored["requests"] = 0
    state = race_pipeline(cover_config([mixed], tiny_checkpoint, tmp_path / "s2", **{"ingest.strict": True}),
                          return_state=True)
    assert state.is_failed()
    with pytest.raises(ValueError, match="3 input line"):
        state.result()
    assert scored["requests"] == 0


def test_parameters_are_checked_with_clear_errors(prefect_harness, tiny_checkpoint, demo_inputs, tmp_path):
    config = cover_config(demo_inputs, tiny_checkpoint, tmp_path / "s")
    with pytest.raises(ValueError, match="parameter 'cover.backend'"):
        race_pipeline(replace(config, **{"cover.backend": "tgi"}))
    with pytest.raises(ValueError, match="parameter 'stages'"):
        race_pipeline(replace(config, stages=("cover", "bake")))
    with pytest.raises(ValueError, match="parameter 'checkpoint'"):
        race_pipeline(replace(config, checkpoint=str(tmp_path / "none")))
    with pytest.raises(ValueError, match="parameter 'cover.epsilon'"):
        race_pipeline(replace(config, **{"cover.epsilon": float("nan")}))


def test_a_stage_left_out_whose_output_is_missing_fails_naming_it(prefect_harness, tiny_checkpoint, demo_inputs,
                                                                  tmp_path):
    config = cover_config(demo_inputs, tiny_checkpoint, tmp_path / "s", stages=("sft", "evaluate"))
    with pytest.raises(LookupError, match="stage 'ingest' was not selected"):
        race_pipeline(config)


def test_a_stage_left_out_is_read_from_the_store(prefect_harness, tiny_checkpoint, demo_inputs, tmp_path, scored):
    first = race_pipeline(cover_config(demo_inputs, tiny_checkpoint, tmp_path / "s"))
    scored["requests"] = 0
    again = race_pipeline(cover_config(demo_inputs, tiny_checkpoint, tmp_path / "s", stages=("compress",)))
    assert scored["requests"] == 0
    assert again["cover"] == first["cover"] and again["objects"] == first["objects"]


def test_nightly_scores_only_the_trajectories_of_a_new_file(prefect_harness, tiny_checkpoint, tmp_path, scored):
    from race_core.envs.expert import expert_dataset

    inbox = tmp_path / "inbox"
    inbox.mkdir()
    trajectories = expert_dataset(9, seed=21)
    for k in range(3):
        (inbox / f"part{k}.jsonl").write_text("".join(json.dumps(t.to_dict()) + "\n"
                                                      for t in trajectories[3 * k: 3 * k + 3]))
    third = inbox / "part2.jsonl"
    held_back = third.read_text()
    third.unlink()
    config = NightlyConfig(inbox=str(inbox / "*.jsonl"), checkpoint=str(tiny_checkpoint), store=str(tmp_path / "store"))

    first = race_nightly(config)
    assert first["new"] == 6 and first["scored_trajectories"] == 6
    again = race_nightly(config)
    assert again["new"] == 0 and again["part"] is None

    third.write_text(held_back)
    scored["trajectories"].clear()
    second = race_nightly(config)
    assert second["new"] == 3 and second["already_compressed"] == 6
    assert scored["trajectories"] == {t.question for t in trajectories[6:9]}
    store = ArtifactStore(config.store)
    parts = Catalog(store).parts(stages.catalog_scope(checkpoint_digest(tiny_checkpoint), CoverConfig(), Resources()))
    assert [p["part"] for p in parts] == [first["part"], second["part"]]
    part2 = read_dataset_from_store(store, second["part"], "compressed")
    assert set(part2["id"]) == {t.id for t in trajectories[6:9]}


def test_a_stage_that_raises_a_value_error_is_not_retried(prefect_harness, tiny_checkpoint, demo_inputs, tmp_path,
                                                         monkeypatch):
    attempts = []

    def bad_input(*args, **kwargs):  # the stage replaced by one raising what a bad parameter raises
        attempts.append(1)
        raise ValueError("injected: scorer noise 3e-3 is not far below epsilon 1e-3")

    monkeypatch.setattr(stages, "compress", bad_input)
    state = race_pipeline(cover_config(demo_inputs, tiny_checkpoint, tmp_path / "s"), return_state=True)
    assert state.is_failed() and len(attempts) == 1


def test_the_nightly_flow_checks_its_parameters_like_the_manual_one(prefect_harness, tiny_checkpoint, tmp_path):
    inbox = tmp_path / "inbox"
    inbox.mkdir()
    base = NightlyConfig(inbox=str(inbox / "*.jsonl"), checkpoint=str(tiny_checkpoint), store=str(tmp_path / "s"))
    for changes, parameter in (({"cover.epsilon": float("nan")}, "cover.epsilon"),
                               ({"cover.epsilon": -0.1}, "cover.epsilon"),
                               ({"cover.backend": "tgi"}, "cover.backend"),
                               ({"checkpoint": str(tmp_path / "none")}, "checkpoint")):
        with pytest.raises(ValueError, match=f"parameter '{parameter}'"):
            race_nightly(replace(base, **changes))


# -- a stage added by its declaration alone ------------------------------------------------------
def toy_entry(store, *, trajectories, config, only_cached, force):
    """The toy stage's entry: counts an ingest's trajectories (a stage's whole code, `run_stage` keyed)."""
    digest = trajectories["objects"]["trajectories"]

    def compute():
        count = sum(1 for _ in stages.iter_trajectories(store, digest))
        return {"objects": {"count": store.put_bytes(json.dumps({"trajectories": count}).encode())},
                "metrics": {"trajectories": count}}

    return stages.run_stage(store, "toy", {"strict": config.strict}, {"trajectories": digest}, None, compute,
                            only_cached, force)


@pytest.fixture
def toy_stage(monkeypatch):
    """A stage that exists only in this test: one declaration (registered for the test) and one function."""
    from tasks.declarations import STAGES, Stage, StageKey

    stage = Stage("toy", 1, ("ingest",), StageKey(("tests/test_flow.py",)), f"{__name__}:toy_entry",
                  inputs=("trajectories",), config="ingest", outputs=("count",))
    monkeypatch.setitem(STAGES, "toy", stage)
    return stage


def test_a_stage_is_one_declaration_one_function_and_one_line_in_a_flow_body(prefect_harness, toy_stage, demo_inputs,
                                                                              tiny_checkpoint, tmp_path):
    from prefect import flow
    from prefect.artifacts import Artifact

    from flows.run import PipelineRun

    @flow
    def with_toy(config: PipelineConfig):
        run = PipelineRun(config)
        ingested = run.stage("ingest", inputs=list(config.inputs))
        return run.stage("toy", trajectories=ingested)  # the one line

    config = replace(cover_config(demo_inputs, tiny_checkpoint, tmp_path / "store"), stages=("ingest", "toy"))
    first = with_toy(config)
    store = ArtifactStore(config.store)
    assert first["cached"] is False and first["metrics"] == {"trajectories": 8}
    assert json.loads(store.get_bytes(first["objects"]["count"])) == {"trajectories": 8}
    assert store.list_manifests("toy")  # under stages/toy/, keyed like every stage
    assert "| trajectories | 8 |" in Artifact.get("race-toy", _sync=True).data  # the generic task's summary
    # left out of the selection, the ingest it needs is looked up; the toy itself is cached
    again = with_toy(replace(config, stages=("toy",)))
    assert again["cached"] is True and again["objects"] == first["objects"]


def test_a_stages_log_line_reaches_the_prefect_api_under_its_task_run(prefect_harness, demo_inputs, tmp_path):
    """A stage logs to its module's logger; Prefect files the line under the stage's task run (the
    project's packages are its extra loggers: flows/__init__.py)."""
    from prefect import flow
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import LogFilter, LogFilterFlowRunId
    from prefect.logging.handlers import APILogHandler

    from race_core.config import IngestConfig
    from tasks.pipeline_tasks import stage_task

    @flow
    def ingest_only():
        state = stage_task("ingest")(str(tmp_path / "store"), inputs=demo_inputs, config=IngestConfig(),
                                     return_state=True)
        return state.state_details.flow_run_id, state.state_details.task_run_id

    flow_run_id, task_run_id = ingest_only()
    APILogHandler().flush()  # the handler sends records in batches: the rest now
    with get_client(sync_client=True) as client:
        logs = client.read_logs(LogFilter(flow_run_id=LogFilterFlowRunId(any_=[flow_run_id])))
    line = "ingest: 8 records = 8 trajectories + 0 rejected lines + 0 duplicates (merged) from 1 file(s)"
    assert [(log.name, log.task_run_id) for log in logs if log.message == line] == [("tasks.stages", task_run_id)], \
        [(log.name, log.message) for log in logs]
