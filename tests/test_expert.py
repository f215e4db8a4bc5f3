"""Scripted calculator expert: solves tasks with its tools, verbose reasoning, valid trajectories."""

from __future__ import annotations

import random
import re
from dataclasses import replace

import pytest

from race_core.envs.calculator import ENVIRONMENT_NAME, generate_tasks
from race_core.envs.expert import EXPERT_SOURCE_REVISION, expert_dataset, expert_episode
from race_core.schema import Trajectory


@pytest.fixture(scope="module")
def episodes():
    rng = random.Random(5)
    return [expert_episode(task, rng) for task in generate_tasks(300, 21)]


def test_expert_solves_nearly_every_task(episodes):
    assert sum(e.success for e in episodes) / len(episodes) >= 0.99


def test_one_calc_per_operation_then_finish():
    rng = random.Random(0)
    for task in generate_tasks(100, 2):
        episode = expert_episode(task, rng)
        actions = [t.action for t in episode.turns]
        assert len(actions) == task.ops + 1
        assert all(a.startswith("calc[") for a in actions[:-1])
        assert actions[-1].startswith("finish[")


def test_turn_zero_always_has_reasoning(episodes):
    assert all(e.turns[0].reasoning for e in episodes)


def test_share_of_empty_reasoning_follows_the_setting(episodes):
    later = [t.reasoning == "" for e in episodes for t in e.turns[1:]]
    assert abs(sum(later) / len(later) - 0.3) < 0.06
    rng = random.Random(1)
    tasks = generate_tasks(50, 3)
    assert all(t.reasoning for task in tasks for t in expert_episode(task, rng, 0.0).turns)
    assert all(not t.reasoning for task in tasks for t in expert_episode(task, rng, 1.0).turns[1:])


def test_reasoning_is_short_with_a_small_vocabulary(episodes):
    allowed = re.compile(r"[A-Za-z0-9+\-*/()=.,: ]*")
    for episode in episodes:
        for turn in episode.turns:
            if turn.reasoning:
                assert 5 <= len(turn.reasoning.split()) <= 30, turn.reasoning
                assert allowed.fullmatch(turn.reasoning), turn.reasoning


def test_expert_never_reads_the_answer():
    for task in generate_tasks(50, 4):
        wrong = replace(task, answer=task.answer + 1)
        played = [expert_episode(t, random.Random(9)) for t in (task, wrong)]
        assert played[0].turns == played[1].turns
        assert played[0].success and not played[1].success


def test_dataset_is_deterministic_and_round_trips_the_schema():
    data = expert_dataset(40, seed=6)
    assert data == expert_dataset(40, seed=6)
    assert len(data) == 40 and len({t.id for t in data}) == 40
    for trajectory in data:
        assert trajectory.environment == ENVIRONMENT_NAME
        assert trajectory.source_revision == EXPERT_SOURCE_REVISION
        again = Trajectory.from_dict(trajectory.to_dict())
        assert again.id == trajectory.id and again.turns == trajectory.turns
        assert again.question == trajectory.question and again.successful
