"""ScienceWorld (`--env scienceworld`): the real simulator (a JVM), played through the environment seam
by the expert, scripted faults and a pool smaller than the episodes that share it."""

from __future__ import annotations

import json
import random

import pytest
from components import require_scienceworld
from conftest import shared_dir

from race_core.envs import get_environment
from race_core.envs.base import CURRENT, EMPTY, LATER, REDUNDANT, heldout_seed
from race_core.envs.scienceworld.world import SHORT_TASKS as SHORT_TASK_TYPES
from race_core.schema import ToolCall


@pytest.fixture(scope="module")
def science(tmp_path_factory):
    """The environment, its task records and expert paths recorded once per test run into a folder the
    xdist workers share."""
    require_scienceworld()
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("RACE_SCIENCEWORLD_CACHE", str(shared_dir(tmp_path_factory, "scienceworld")))
        patch.setenv("RACE_SCIENCEWORLD_SIMULATORS", "1")  # one JVM (1.1 GB) for the module's episodes
        yield get_environment("scienceworld")


@pytest.fixture(scope="module")
def drawn(science):
    """Two training tasks and two held-out ones of the default shape."""
    return science.generate_tasks(2, 3), science.generate_tasks(2, heldout_seed(3))


LOOK_OUTSIDE = """This outside location is called the outside. Here you see:
\tthe agent
\ta substance called air
\ta frog egg
\ta fire pit (containing nothing)
\ta table. On the table is: a bowl (containing a red apple, a banana), a drawer.
You also see:
\tA door to the greenhouse (that is open)"""


def test_commands_objects_and_kinds_are_read_without_the_simulator():
    from race_core.envs.scienceworld.world import (
        _shown,
        _without_round_trips,
        filed,
        objects_of,
        reasoning_kind,
        sim_command,
    )

    assert objects_of("move egg turtle egg in inventory to orange box") == ["egg turtle egg in inventory", "orange box"]
    assert objects_of("pour cup containing blue paint in art studio in jug") == [
        "cup containing blue paint in art studio", "jug"]
    assert objects_of("focus on frog egg") == ["frog egg"] and objects_of("open door to kitchen") == []
    assert _shown(LOOK_OUTSIDE, "egg frog") == "frog egg"  # the simulator's referents reorder words
    assert _shown(LOOK_OUTSIDE, "banana") == "bowl (containing a red apple, a banana)"
    assert _shown(LOOK_OUTSIDE, "axe") is None
    assert sim_command("  focus  on \u00e9frog egg ") == "focus on frog egg" and len(sim_command("a" * 500)) == 200
    assert [reasoning_kind(t) for t in ("", "Noted for later: the frog egg is here, in the outside.",
                                        "I go to the kitchen.", "The reading: the thermometer measures 3 degrees.",
                                        "That should complete the task: find a(n) animal.")] == [
        EMPTY, LATER, CURRENT, CURRENT, REDUNDANT]

    rule = ("Your task is to measure the temperature of unknown substance B. If the unknown substance B temperature is "
            "above 50.0 degrees celsius, place it in the green box. If the unknown substance B temperature is below 50.0 "
            "degrees celsius, place it in the blue box.")
    move = "move unknown substance B in inventory to green box"
    assert filed(move, "the thermometer measures a temperature of 49 degrees celsius", rule) == (
        "move unknown substance B in inventory to blue box", "a temperature of 49 degrees, below 50.0: the blue box")
    assert filed(move, "the thermometer measures a temperature of 57 degrees celsius", rule)[0] == move
    assert filed(move, "the thermometer measures a temperature of 50 degrees celsius", rule) == (move, "")  # undecided
    assert filed(move, "You move to the kitchen.", rule) == (move, "") and filed("look around", "", rule)[1] == ""

    # a detour (hallway -> bedroom -> hallway) goes; a door opened in it that a later command goes through stays
    commands = ["open door to bedroom", "go to bedroom", "go to hallway", "open door to kitchen", "go to kitchen",
                "go to hallway", "focus on picture", "go to kitchen"]
    observations = ["The door is now open.", "You move to the bedroom.", "You move to the hallway.",
                    "The door is now open.", "You move to the kitchen.", "You move to the hallway.",
                    "You focus on the picture.", "You move to the kitchen."]
    assert _without_round_trips(commands, observations, "hallway") == [
        "open door to kitchen", "focus on picture", "go to kitchen"]
    # a door opened from another room than the one the stretch comes back to: that stretch is kept
    commands = ["go to kitchen", "open door to outside", "go to hallway", "focus on picture", "go to kitchen",
                "go to outside"]
    observations = ["You move to the kitchen.", "The door is now open.", "You move to the hallway.",
                    "You focus on the picture.", "You move to the kitchen.", "You move to the outside."]
    assert _without_round_trips(commands, observations, "hallway") == commands


def test_tasks_are_variations_of_the_packages_own_splits_recorded_once(science, drawn):
    from race_core.envs.scienceworld.world import SHORT_TASKS, cache_dir, task_of, variations

    train, held_out = drawn
    assert [t.task_id for t in science.generate_tasks(2, 3)] == [t.task_id for t in train]
    assert {t.split for t in train} == {"train"} and {t.split for t in held_out} == {"test"}
    lists = variations()
    for task in train + held_out:
        assert task.task_type in SHORT_TASKS and task.variation in lists[task.task_type][task.split]
        assert task.question.startswith("Task Description:") and "act[<command>]" in task.question
        assert "This room is called" in task.question or "outside location" in task.question
    assert not {t.question for t in train} & {t.question for t in held_out}
    record = cache_dir() / "tasks" / f"{train[0].task_type}-{train[0].variation}.json"
    stored = json.loads(record.read_text())
    record.write_text(json.dumps({**stored, "gold": ["look around", *stored["gold"]]}))
    try:  # what was recorded is what is read: the simulator is not asked again for another gold path
        assert task_of(train[0].task_type, train[0].variation, "train").gold[0] == "look around"
    finally:
        record.write_text(json.dumps(stored))
    assert [t.task_type for t in science.generate_tasks(2, 0, shape="use-thermometer")] == ["use-thermometer"] * 2
    with pytest.raises(ValueError, match="shape must be one of"):
        science.generate_tasks(1, 0, shape="chess")
    with pytest.raises(ValueError, match="difficulty must be None"):
        science.generate_tasks(1, 0, difficulty=1)


def test_the_score_judges_a_wrong_focus_loses_and_the_budget_ends_it(science, drawn):
    from race_core.envs.scienceworld.world import INVALID_ACTION_OBSERVATION, expert_commands

    task = drawn[0][0]
    episode = science.episode(task, 8)
    assert episode.max_turns == 30  # the paper's budget: a smaller max_turns cannot make a task unwinnable
    assert episode.step("look around").observation == INVALID_ACTION_OBSERVATION  # not act[...]: a turn used
    for k, command in enumerate(expert_commands(task)):  # the call form of templates with tools is the same action
        result = episode.step((ToolCall("act", {"command": command}),) if k % 2 else f"act[{command}]")
    assert result.done and episode.success and episode.reward == 1.0 and episode.score == 100

    wrong = science.episode(task, 8)
    result = wrong.step("act[focus on agent]")  # focusing on the wrong thing: a negative score ends it
    assert result.done and wrong.finished and not wrong.success and wrong.score < 0

    spent = science.episode(task, 1)
    for _ in range(spent.max_turns):
        result = spent.step("act[wait1]")
    assert result.done and not spent.success and not spent.finished


def test_episodes_share_a_pool_smaller_than_them_and_replay_when_they_get_a_simulator_back(science, drawn):
    from race_core.envs.scienceworld.simulator import SimulatorPool
    from race_core.envs.scienceworld.world import ScienceWorldEpisode, expert_commands

    tasks = drawn[0]
    paths = [expert_commands(task) for task in tasks]
    pool = SimulatorPool(1)
    try:
        episodes = [ScienceWorldEpisode(task, 30, pool=pool) for task in tasks]
        for k in range(max(map(len, paths))):  # interleaved: each step takes the one simulator from the other
            for episode, path in zip(episodes, paths, strict=True):
                if k < len(path):
                    episode.step(f"act[{path[k]}]")
        assert all(e.success for e in episodes) and pool.started == 1
    finally:
        pool.close()


def test_the_expert_notes_where_things_are_for_later_and_env_check_passes(science):
    from race_core.envs.check import check_environment
    from race_core.envs.scienceworld.world import ScienceWorldExpert, _shown, generate_tasks, objects_of

    result = check_environment("scienceworld", tasks=2, seed=3)
    assert result.ok, result.problems
    assert result.facts["expert_won"] == "2/2"
    notes = 0
    for task in generate_tasks(2, 3) + generate_tasks(1, 0, shape="use-thermometer"):
        expert = ScienceWorldExpert.for_task(task, random.Random(0))
        episode = science.run_episode(task, expert, task.turn_budget)
        assert len(expert.kinds) == len(episode.turns) and all(
            science.reasoning_kind(t.reasoning) == kind for t, kind in zip(episode.turns, expert.kinds, strict=True))
        if task.task_type == "use-thermometer":  # the box is the one the reading decides, whatever the gold path's
            k = next(k for k, t in enumerate(episode.turns) if "measures a temperature" in t.observation) + 1
            assert expert.kinds[k] == CURRENT
            assert episode.turns[k].reasoning.startswith(("The reading: ", "I read the result: "))
            decided = episode.turns[k].reasoning.rsplit("the ", 1)[1].rstrip(".")  # "... below 50.0: the blue box."
            assert episode.turns[k].action.endswith(f"to {decided}]")
        else:  # the simulator's judge and its thermometer can disagree near the threshold: only these must win
            assert episode.success
        for k, kind in enumerate(expert.kinds):
            if kind == LATER:  # a thing a later command names, shown now and by nothing in between
                notes += 1
                later = [n for c in expert.commands[k + 1:] for n in objects_of(c)]
                assert any(_shown(episode.turns[k - 1].observation if k else task.question, n) for n in later) or \
                    "box" in episode.turns[k].reasoning
    assert notes >= 1
    from race_core.envs.scienceworld.simulator import POOL

    assert POOL.started == 1  # every task record, replay and episode of the module on one JVM


def test_a_real_policy_plays_held_out_tasks_and_the_bench_reports_them_by_task_type(science, tiny_checkpoint):
    from bench.sampling import format_sampling, run_sampling

    report = run_sampling(str(tiny_checkpoint), "scienceworld", tasks=2, samples=1, temperature=0.0, max_new_tokens=8,
                          max_turns=3, backends=("hf",), batch_size=2)
    run = report["runs"][0]
    assert run["episodes"] == 2 and 2 <= run["turns"] <= 2 * 30  # within the paper's budget of 30 turns
    groups = run["by_group"]
    assert sum(g["episodes"] for g in groups.values()) == 2 and set(groups) <= set(SHORT_TASK_TYPES)
    assert "hf, by task group: " in format_sampling(report)
