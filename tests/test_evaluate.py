"""Policy evaluation: greedy and sampled episodes. Every figure of the report is recomputed here
from the episodes' raw generated tokens, without the rollout's tags or the environment's judge: the
turns are the runs of generated tokens, the format a regular expression, the answer the task's
expression evaluated in exact fractions, the reasoning the tokens after the open think marker up to
the close marker (or the end of a turn cut at its token limit)."""

from __future__ import annotations

import re
from fractions import Fraction

import pytest

from race_core.envs.calculator import task_split
from race_core.evaluate import evaluate_policy, heldout_tasks
from race_core.policy import load_policy
from race_core.render import Renderer
from race_core.sampling import stop_token_ids
from race_core.train.bootstrap import SMOKE, ensure_bootstrap, smoke_tasks

TURN = re.compile(r"<think>(.*?)</think>\nAction: (.*)", re.S)
FINISH = re.compile(r"finish\[\s*(-?\d+(?:/\d+|\.\d+)?)\s*\]")


@pytest.fixture(scope="module")
def policy(tmp_path_factory):
    return load_policy(ensure_bootstrap(tmp_path_factory.getbasetemp() / "race-shared", SMOKE).checkpoint)


def true_value(expression: str) -> Fraction:
    """The task's answer, computed here: its integers as exact fractions (a generated expression of
    digits, + - * / and parentheses, nothing else)."""
    assert re.fullmatch(r"[\d\s+\-*/()]+", expression), expression
    return eval(re.sub(r"\d+", lambda m: f"Fraction({m.group()})", expression), {"Fraction": Fraction})  # noqa: S307


def independent_figures(tokenizer, tasks, episodes) -> dict:
    """The report's figures from each episode's generated tokens (module doc)."""
    renderer = Renderer(tokenizer)
    (open_id,), (close_id,) = renderer.open_ids, renderer.close_ids  # single tokens in this tokenizer
    stops = set(stop_token_ids(tokenizer, renderer))
    answers = {task.task_id: true_value(task.expression) for task in tasks}
    turns = well_formed = reasoning = successes = 0
    for episode in episodes:
        runs, current = [], []
        for token, generated in zip(episode.token_ids, episode.policy_mask, strict=True):
            if generated:
                current.append(token)
            elif current:
                runs, current = [*runs, current], []
        runs += [current] if current else []
        turns += len(runs)
        last_action = ""
        for ids in runs:
            stopped = ids[-1] in stops
            text = tokenizer.decode(ids[:-1] if stopped else ids, skip_special_tokens=False)
            match = TURN.fullmatch(text)
            well_formed += bool(match and stopped)
            if ids[0] == open_id:  # reasoning: after the open marker, to the close marker or the cut
                body = ids[:-1] if stopped else ids
                reasoning += (body.index(close_id) if close_id in body else len(body)) - 1
            last_action = match.group(2) if match and stopped else ""
        finished = FINISH.fullmatch(last_action.strip())
        successes += bool(finished and Fraction(finished.group(1)) == answers[episode.task_id])
    n = len(episodes)
    return {"success_rate": successes / n, "turns_per_episode": turns / n, "well_formed_rate": well_formed / turns,
            "reasoning_tokens_per_episode": reasoning / n}


def report_figures(report) -> dict:
    return {key: getattr(report, key) for key in
            ("success_rate", "turns_per_episode", "well_formed_rate", "reasoning_tokens_per_episode")}


def test_greedy_evaluation_of_the_fitted_tasks_succeeds_and_its_figures_match_the_tokens(policy):
    model, tokenizer = policy
    tasks = smoke_tasks()
    report = evaluate_policy(model, tokenizer, tasks, greedy=True, max_new_tokens=64, max_turns=4)
    assert [e.task_id for e in report.episodes] == [t.task_id for t in tasks]
    figures = independent_figures(tokenizer, tasks, report.episodes)
    assert report_figures(report) == pytest.approx(figures, abs=1e-12)
    # the SMOKE policy was fitted to exactly these tasks' expert episodes: one calc, one finish
    assert figures["success_rate"] == 1.0 and figures["turns_per_episode"] == 2.0
    assert figures["well_formed_rate"] == 1.0 and figures["reasoning_tokens_per_episode"] > 0


def test_sampled_heldout_evaluation_figures_match_the_tokens_and_the_seed_repeats_them(policy):
    model, tokenizer = policy
    tasks = heldout_tasks(3, seed=0)
    assert all(task_split(t.expression) == "heldout" for t in tasks)
    report = evaluate_policy(model, tokenizer, tasks, greedy=False, samples=2, seed=0, max_new_tokens=24,
                             max_turns=2)
    assert sorted(e.task_id for e in report.episodes) == sorted(t.task_id for t in tasks for _ in range(2))
    assert report_figures(report) == pytest.approx(independent_figures(tokenizer, tasks, report.episodes), abs=1e-12)
    again = evaluate_policy(model, tokenizer, tasks, greedy=False, samples=2, seed=0, max_new_tokens=24,
                            max_turns=2)
    assert [e.token_ids for e in again.episodes] == [e.token_ids for e in report.episodes]  # seeded
    other = evaluate_policy(model, tokenizer, tasks, greedy=False, samples=2, seed=1, max_new_tokens=24,
                            max_turns=2)
    assert [e.token_ids for e in other.episodes] != [e.token_ids for e in report.episodes]


def test_evaluation_refuses_an_empty_task_list(policy):
    with pytest.raises(ValueError, match="at least one task"):
        evaluate_policy(*policy, [])
