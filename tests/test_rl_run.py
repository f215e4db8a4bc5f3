"""The rl stage as one training run (tasks/rl_run.py) on the SMOKE policy, sampled by transformers:
the optimizer's state carries from one iteration to the next, a run stopped part way through an
iteration resumes to the same rollouts and checkpoints as an uninterrupted one, a finished run is
not run again and asking for more iterations continues it, superseded states leave the store, and
the evaluations' figures are what their stored episodes say.

The policy plays its own training tasks at temperature 1 at iteration 0 (its groups mix wins and
losses; later iterations draw tasks it was not fitted to, which it loses); ε = 10 makes the cover
accept every removal, so the first update carries masked reasoning and closure terms.
"""

from __future__ import annotations

import pytest
import torch

from race_core.config import EvalConfig, Resources, RLConfig, replace
from race_core.train.bootstrap import SMOKE
from storage import ArtifactStore

CONFIG = RLConfig(iterations=2, tasks_per_iteration=SMOKE.expert_tasks, group_size=4, temperature=1.0,
                  max_new_tokens=64, max_turns=4, lr=1e-5, seed=SMOKE.expert_seed, difficulty=SMOKE.difficulty,
                  epochs=2, mini_batch=8, eval_every=2)
EVAL = EvalConfig(tasks=4, max_turns=3, max_new_tokens=48)
EPSILON = 10.0
STEPS_PER_ITERATION = CONFIG.epochs * (CONFIG.tasks_per_iteration * CONFIG.group_size // CONFIG.mini_batch)


@pytest.fixture(scope="module")
def runs(smoke_policy, tmp_path_factory):
    """The same run twice: uninterrupted, and stopped twice then run again: after iteration 1's state
    was written but before its record was committed, then (resumed from the state before it) right
    after iteration 1's update."""
    from tasks.rl_run import FAULT_ENV, InjectedFault, rl_run
    from tasks.training_stages import PolicyRef

    out = {}
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("RACE_CHECKPOINT_CACHE", str(tmp_path_factory.mktemp("rl-run") / "checkpoints"))
        for name in ("whole", "resumed"):
            store = ArtifactStore(str(tmp_path_factory.mktemp(f"rl-{name}")))
            policy = PolicyRef.local(smoke_policy)
            if name == "resumed":
                for fault in ("1:saved", "1"):
                    patch.setenv(FAULT_ENV, fault)
                    with pytest.raises(InjectedFault):
                        rl_run(store, policy, CONFIG, EPSILON, EVAL, Resources())
                patch.delenv(FAULT_ENV)
            out[name] = (store, rl_run(store, policy, CONFIG, EPSILON, EVAL, Resources()))
        yield out


def _chain(manifest):
    return [(m["rollouts_object"], m["iteration"]) for m in manifest["metrics"]["iterations"]]


def test_a_run_stopped_mid_iteration_resumes_to_the_uninterrupted_runs_rollouts_and_checkpoints(runs):
    (_, whole), (store, resumed) = runs["whole"], runs["resumed"]
    assert not whole["cached"] and not resumed["cached"]
    assert _chain(resumed) == _chain(whole) and len(_chain(whole)) == CONFIG.iterations
    assert resumed["policy_digest"] == whole["policy_digest"]
    assert resumed["objects"]["checkpoint"] == whole["objects"]["checkpoint"]
    for mine, theirs in zip(resumed["metrics"]["iterations"], whole["metrics"]["iterations"], strict=True):
        assert mine["step_losses"] == theirs["step_losses"] and mine["grad_norms"] == theirs["grad_norms"]
    # the resumed run picked up after iteration 0: its first update was not done again
    assert resumed["metrics"]["iterations"][0]["seconds"] == pytest.approx(
        store.read_record(f"stages/rl-iteration/{resumed['metrics']['scope']}-0.json")["metrics"]["seconds"])


def test_the_optimizer_state_carries_from_one_iteration_to_the_next(runs):
    """AdamW's step count and moments after the run are those of every optimizer step of every
    iteration, and its first moment is no sign step: a fresh optimizer each iteration would count
    only that iteration's steps."""
    from race_core.train.optimizer_state import META_FILE, STATE_FILE

    store, manifest = runs["whole"]
    scope = manifest["metrics"]["scope"]
    state = store.read_record(f"stages/rl-resume/{scope}.json")
    assert state["iteration"] == CONFIG.iterations - 1 and state["policy_digest"] == manifest["policy_digest"]
    files = store.read_tree(state["objects"]["optimizer"])
    assert set(files) == {STATE_FILE, META_FILE}
    from safetensors.torch import load

    tensors = load(store.get_bytes(files[STATE_FILE]))
    steps = {float(v) for k, v in tensors.items() if k.endswith("/step")}
    assert steps == {float(CONFIG.iterations * STEPS_PER_ITERATION)}
    assert all(len(m["step_losses"]) == STEPS_PER_ITERATION for m in manifest["metrics"]["iterations"])
    assert any(float(v.abs().max()) > 0 for k, v in tensors.items() if k.endswith("/exp_avg_sq"))


def test_superseded_states_leave_the_store_and_the_last_checkpoint_stays(runs):
    store, manifest = runs["whole"]
    trees = [d for d in store.iter_objects() if store._is_tree(d)]
    scope = manifest["metrics"]["scope"]
    state = store.read_record(f"stages/rl-resume/{scope}.json")
    assert manifest["objects"]["checkpoint"] == state["objects"]["checkpoint"]
    # the last policy's checkpoint and the optimizer state beside it: no earlier iteration's remains
    assert sorted(trees) == sorted(state["objects"].values())
    records = [store.read_record(f"stages/rl-iteration/{scope}-{i}.json") for i in range(CONFIG.iterations)]
    assert [("checkpoint" in r["objects"]) for r in records] == [False] * (CONFIG.iterations - 1) + [True]


def test_a_finished_run_is_not_run_again_and_more_iterations_continue_it(runs, smoke_policy, monkeypatch, tmp_path):
    from tasks.rl_run import rl_run
    from tasks.training_stages import PolicyRef

    monkeypatch.setenv("RACE_CHECKPOINT_CACHE", str(tmp_path / "checkpoints"))
    store, manifest = runs["whole"]
    policy = PolicyRef.local(smoke_policy)
    again = rl_run(store, policy, CONFIG, EPSILON, EVAL, Resources())
    assert again["cached"] and again["policy_digest"] == manifest["policy_digest"]
    longer = rl_run(store, policy, replace(CONFIG, iterations=CONFIG.iterations + 1), EPSILON, EVAL, Resources())
    assert not longer["cached"] and _chain(longer)[:CONFIG.iterations] == _chain(manifest)
    assert [m["seconds"] for m in longer["metrics"]["iterations"][:CONFIG.iterations]] == [
        m["seconds"] for m in manifest["metrics"]["iterations"]]  # the records read, not run again
    assert len(longer["metrics"]["iterations"]) == CONFIG.iterations + 1
    # a yet longer run stopped after committing an iteration whose checkpoint it did not keep (not its
    # last): asking for exactly the iterations committed gives the policy of the state after them
    from tasks.rl_run import FAULT_ENV, InjectedFault

    n = CONFIG.iterations + 2
    monkeypatch.setenv(FAULT_ENV, str(n))
    with pytest.raises(InjectedFault):
        rl_run(store, policy, replace(CONFIG, iterations=n + 1), EPSILON, EVAL, Resources())
    monkeypatch.delenv(FAULT_ENV)
    scope = manifest["metrics"]["scope"]
    state = store.read_record(f"stages/rl-resume/{scope}.json")
    assert state["iteration"] == n - 1
    assert "checkpoint" not in store.read_record(f"stages/rl-iteration/{scope}-{n - 1}.json")["objects"]
    asked = rl_run(store, policy, replace(CONFIG, iterations=n), EPSILON, EVAL, Resources())
    assert asked["policy_digest"] == state["policy_digest"] and asked["objects"]["checkpoint"] == state["objects"]["checkpoint"]
    assert _chain(asked)[:CONFIG.iterations + 1] == _chain(longer)
    # that run finished; asking again for the iterations before its last (another eval_every: not cached)
    # plays them again and leaves the longer run's state as it is
    finished = rl_run(store, policy, replace(CONFIG, iterations=n + 1), EPSILON, EVAL, Resources())
    state = store.read_record(f"stages/rl-resume/{scope}.json")
    assert state["iteration"] == n and "before" not in state  # the iteration committed, the state before gone
    shorter = rl_run(store, policy, replace(CONFIG, iterations=n, eval_every=n), EPSILON, EVAL, Resources())
    assert not shorter["cached"] and shorter["policy_digest"] == asked["policy_digest"]
    assert store.read_record(f"stages/rl-resume/{scope}.json") == state
    assert store.manifest_damage(state) is None  # its objects were not discarded by the shorter run
    assert _chain(finished)[:n] == _chain(shorter)


def test_the_evaluations_figures_are_the_stored_episodes(runs):
    """Held-out evaluations at iteration 0 (the start), every `eval_every` and after the last; each
    one's skip ratio and reasoning tokens recomputed from its episodes dataset."""
    from storage.parquet import read_dataset_from_store

    store, manifest = runs["whole"]
    points = manifest["metrics"]["evaluations"]
    assert [p["iteration"] for p in points] == [0, 2]
    for point in points:
        episodes = read_dataset_from_store(store, point["episodes_object"], "episodes")
        assert len(episodes) == EVAL.tasks == point["episodes"]
        turns = [t for ts in episodes["turns"] for t in ts]
        skipped = sum(not t["reasoning"].strip() for t in turns)
        assert point["skip_ratio"] == pytest.approx(skipped / len(turns))
        assert point["reasoning_tokens_per_episode"] == pytest.approx(
            sum(sum(r) for r in episodes["reasoning_tokens"]) / len(episodes))
        assert point["success_rate"] == pytest.approx(episodes["successful"].mean())
        assert set(episodes["policy_digest"]) == {point["policy_digest"]}


def test_each_iteration_records_its_phases_and_what_the_skipped_rows_saved(runs):
    _, manifest = runs["whole"]
    for metrics in manifest["metrics"]["iterations"]:
        phases = metrics["phases"]
        assert {"sample", "cover", "policy_forward_backward", "optimizer", "checkpoint_write"} <= set(phases)
        assert all(v >= 0 for v in phases.values())
        assert metrics["trained_tokens"] >= 0
        assert 0.0 <= metrics["skip_ratio"] <= 1.0
        assert torch.isfinite(torch.tensor(metrics["loss"]))
    first = manifest["metrics"]["iterations"][0]  # the starting policy wins some of its groups' rollouts
    assert 0 < first["success_rate"] < 1 and first["masked_tokens"] > 0 and first["closure_terms"] > 0
    # rows left out of the backward: those of groups whose rollouts all won or all lost (advantage 0)
    from race_core.rollout import rollouts_from_json

    store = runs["whole"][0]
    for metrics in manifest["metrics"]["iterations"]:
        rollouts = rollouts_from_json(store.get_bytes(metrics["rollouts_object"]).decode())
        groups = {}
        for r in rollouts:
            groups.setdefault(r.group, []).append(r.reward)
        alike = sum(len(g) for g in groups.values() if len(set(g)) == 1)
        assert metrics["skipped_rows"] == alike  # each row once, whatever the epochs


def test_race_bench_rl_writes_each_phase_the_baseline_and_the_precision_check(smoke_policy, tmp_path, monkeypatch):
    """`race bench rl` on the SMOKE policy (transformers sampling): the record names the CPU, every
    iteration's phases and the evaluation, the rebuilt-every-iteration baseline with its ratios, and
    bf16 against float32 on the first rollouts."""
    import json

    from flows.cli import main

    monkeypatch.setenv("RACE_CHECKPOINT_CACHE", str(tmp_path / "checkpoints"))
    out = tmp_path / "bench-rl.json"
    assert main(["bench", "rl", "--checkpoint", str(smoke_policy), "--env", "calculator", "--iterations", "2",
                 "--tasks", "2", "--group", "2", "--eval-tasks", "2", "--sampler", "hf", "--max-new-tokens", "32",
                 "--max-turns", "3", "--compare", "--precision", "--json", str(out)]) == 0
    record = json.loads(out.read_text())
    assert record["cpu"]["model"] and isinstance(record["fast_bf16"], bool)
    for run in (record, record["before"]):
        assert [r["iteration"] for r in run["iterations"]] == [1, 2]
        for row in run["iterations"]:
            assert {"sample", "policy_forward_backward", "optimizer", "checkpoint_write"} <= set(row["phases"])
            assert row["seconds"] >= sum(v for k, v in row["phases"].items() if k != "sample") * 0.99
        assert run["evaluation"]["episodes"] == 2 and run["evaluation"]["seconds"] > 0
    assert record["speedup"]["iteration_after_the_first"] > 0 and record["speedup"]["evaluation"] > 0
    precision = record["precision"]
    assert -1.0 <= precision["gradient_cosine"] <= 1.0 and precision["loss_relative_difference"] >= 0
    assert precision["no"]["seconds"] > 0 and precision["bf16"]["seconds"] > 0
