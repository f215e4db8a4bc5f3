"""Policy evaluation: greedy and sampled episodes, sane success / reasoning / turn figures."""

from __future__ import annotations

import pytest

from race_core.envs.calculator import task_split
from race_core.evaluate import evaluate_policy, heldout_tasks
from race_core.policy import load_policy
from race_core.train.bootstrap import SMOKE, ensure_bootstrap, smoke_tasks


@pytest.fixture(scope="module")
def policy(tmp_path_factory):
    return load_policy(ensure_bootstrap(tmp_path_factory.getbasetemp() / "race-shared", SMOKE).checkpoint)


def test_greedy_evaluation_of_the_fitted_tasks_succeeds_with_consistent_counts(policy):
    model, tokenizer = policy
    tasks = smoke_tasks()
    report = evaluate_policy(model, tokenizer, tasks, greedy=True, max_new_tokens=64, max_turns=4)
    assert len(report.episodes) == len(tasks)
    assert report.success_rate == 1.0  # the SMOKE policy was fitted to exactly these episodes
    assert report.turns_per_episode == 2.0  # one calc, one finish
    expected = sum(e.reasoning_token_count() for e in report.episodes) / len(tasks)
    assert report.reasoning_tokens_per_episode == expected > 0
    assert report.well_formed_rate == 1.0


def test_heldout_and_sampled_evaluation_give_sane_numbers(policy):
    model, tokenizer = policy
    tasks = heldout_tasks(3, seed=0)
    assert all(task_split(t.expression) == "heldout" for t in tasks)
    report = evaluate_policy(model, tokenizer, tasks, greedy=False, samples=2, seed=0, max_new_tokens=24,
                             max_turns=2)
    assert len(report.episodes) == 6
    assert 0.0 <= report.success_rate <= 1.0
    assert 1.0 <= report.turns_per_episode <= 2.0
    assert 0.0 <= report.well_formed_rate <= 1.0 and report.reasoning_tokens_per_episode >= 0
    again = evaluate_policy(model, tokenizer, tasks, greedy=False, samples=2, seed=0, max_new_tokens=24,
                            max_turns=2)
    assert [e.token_ids for e in again.episodes] == [e.token_ids for e in report.episodes]  # seeded


def test_evaluation_refuses_an_empty_task_list(policy):
    with pytest.raises(ValueError):
        evaluate_policy(*policy, [])
