"""The Prefect pipeline on a real temporary server: caching, retries, rejects, nightly."""

import json

import pytest

from flows.nightly import race_nightly
from flows.pipeline import race_pipeline
from race_core.scoring.hf import HFScorer
from race_core.tiny import checkpoint_digest
from storage import ArtifactStore, Catalog, read_dataset_from_store
from tasks import stages

COVER = ["ingest", "validate", "score", "decide"]


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
    params = dict(inputs=demo_inputs, checkpoint=str(tiny_checkpoint), store=str(tmp_path / "store"), stages=COVER)
    first = race_pipeline(**params)
    assert scored["requests"] > 0
    assert not any(s["cached"] for s in first["stages"].values())
    scored["requests"] = 0
    second = race_pipeline(**params)
    assert scored["requests"] == 0
    assert set(second["stages"]) == {"ingest", "score", "decide"}
    assert all(s["cached"] for s in second["stages"].values())
    assert second["objects"] == first["objects"]


def test_a_fault_that_fails_once_is_retried(prefect_harness, tiny_checkpoint, demo_inputs, tmp_path, monkeypatch):
    real = stages.decide
    attempts = []

    def flaky(*args, **kwargs):  # fault injected on purpose
        attempts.append(1)
        if len(attempts) == 1:
            raise ConnectionError("injected: object store unreachable")
        return real(*args, **kwargs)

    monkeypatch.setattr(stages, "decide", flaky)
    summary = race_pipeline(inputs=demo_inputs, checkpoint=str(tiny_checkpoint), store=str(tmp_path / "s"),
                            stages=COVER)
    assert len(attempts) == 2
    assert summary["cover"]["candidates"] > 0


def test_a_permanent_failure_fails_the_run_naming_the_stage(prefect_harness, tiny_checkpoint, demo_inputs,
                                                            tmp_path, monkeypatch):
    def broken(*args, **kwargs):  # fault injected on purpose
        raise RuntimeError("injected: disk full")

    monkeypatch.setattr(stages, "score", broken)
    state = race_pipeline(inputs=demo_inputs, checkpoint=str(tiny_checkpoint), store=str(tmp_path / "s"),
                          stages=COVER, return_state=True)
    assert state.is_failed()
    with pytest.raises(RuntimeError, match="disk full"):
        state.result()
    from prefect.client.orchestration import get_client

    async def failed_tasks():
        from prefect.client.schemas.filters import FlowRunFilter, FlowRunFilterId

        async with get_client() as client:
            runs = await client.read_task_runs(flow_run_filter=FlowRunFilter(id=FlowRunFilterId(any_=[
                state.state_details.flow_run_id])))
            return {r.name.rsplit("-", 1)[0] for r in runs if r.state.is_failed()}

    import asyncio

    assert asyncio.run(failed_tasks()) == {"score"}


def test_bad_rows_are_listed_and_strict_stops_before_scoring(prefect_harness, tiny_checkpoint, demo_inputs,
                                                             tmp_path, scored):
    mixed = tmp_path / "mixed.jsonl"
    good = [json.loads(x) for x in open(demo_inputs[0])][:3]
    bad = [{**good[0], "split": "test"}, {**good[1], "successful": False}]
    mixed.write_text("\n".join([json.dumps(good[0]), json.dumps(bad[0]), "{oops", json.dumps(good[1]),
                                json.dumps(bad[1]), json.dumps(good[2])]) + "\n")
    store = str(tmp_path / "store")
    summary = race_pipeline(inputs=[str(mixed)], checkpoint=str(tiny_checkpoint), store=store, stages=COVER)
    assert summary["trajectories"] == {"ingested": 3, "rejected": 3}
    rejects = read_dataset_from_store(ArtifactStore(store), summary["objects"]["rejects"], "rejects")
    assert list(rejects["line"]) == [2, 3, 5]
    assert list(rejects["code"]) == ["bad_split", "not_json", "not_successful"]
    scored["requests"] = 0
    state = race_pipeline(inputs=[str(mixed)], checkpoint=str(tiny_checkpoint), store=str(tmp_path / "s2"),
                          stages=COVER, strict=True, return_state=True)
    assert state.is_failed()
    with pytest.raises(ValueError, match="3 input line"):
        state.result()
    assert scored["requests"] == 0


def test_parameters_are_checked_with_clear_errors(prefect_harness, tiny_checkpoint, demo_inputs, tmp_path):
    with pytest.raises(ValueError, match="parameter 'backend'"):
        race_pipeline(inputs=demo_inputs, checkpoint=str(tiny_checkpoint), backend="tgi")
    with pytest.raises(ValueError, match="parameter 'stages'"):
        race_pipeline(inputs=demo_inputs, checkpoint=str(tiny_checkpoint), stages=["score", "bake"])
    with pytest.raises(ValueError, match="parameter 'checkpoint'"):
        race_pipeline(inputs=demo_inputs, checkpoint=str(tmp_path / "none"))


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
    params = dict(inbox=str(inbox / "*.jsonl"), checkpoint=str(tiny_checkpoint), store=str(tmp_path / "store"))

    first = race_nightly(**params)
    assert first["new"] == 6 and first["scored_trajectories"] == 6
    again = race_nightly(**params)
    assert again["new"] == 0 and again["part"] is None

    third.write_text(held_back)
    scored["trajectories"].clear()
    second = race_nightly(**params)
    assert second["new"] == 3 and second["already_compressed"] == 6
    assert scored["trajectories"] == {t.question for t in trajectories[6:9]}
    store = ArtifactStore(params["store"])
    parts = Catalog(store).parts(stages.catalog_scope(checkpoint_digest(tiny_checkpoint), stages.CoverConfig()))
    assert [p["part"] for p in parts] == [first["part"], second["part"]]
    part2 = read_dataset_from_store(store, second["part"], "compressed")
    assert set(part2["id"]) == {t.id for t in trajectories[6:9]}
