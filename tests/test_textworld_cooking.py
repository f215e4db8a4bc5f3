"""TextWorld's cooking games (`--env textworld-cooking`): real games compiled by textworld, played
through the environment seam by the expert, a scripted fault and a real (tiny) policy."""

from __future__ import annotations

import random

import pytest
from components import require_textworld
from conftest import shared_dir

from race_core.envs import get_environment
from race_core.envs.base import CURRENT, EMPTY, LATER, REASONING_KINDS, REDUNDANT, heldout_seed
from race_core.schema import ToolCall


@pytest.fixture(scope="module")
def cooking(tmp_path_factory):
    """The environment, its games compiled once per test run into a folder the xdist workers share."""
    require_textworld()
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("RACE_TEXTWORLD_GAMES", str(shared_dir(tmp_path_factory, "textworld-games")))
        yield get_environment("textworld-cooking")


@pytest.fixture(scope="module")
def one_room(cooking):
    """Three training games of one ingredient (everything in the kitchen) and two held-out ones."""
    return cooking.generate_tasks(3, 5, difficulty=1), cooking.generate_tasks(2, heldout_seed(5), difficulty=1)


BANNER_FEEDBACK = """
   ________  ________
  |        \\|        \\
   \\$$$$$$$$| $$$$$$$$

You open the copy of "Cooking: A Modern Approach (3rd Ed.)" and start reading:

Recipe #1
---------
Gather all following ingredients and follow the directions to prepare this tasty meal.

Ingredients:
block of cheese
  pork chop

Directions:
dice the block of cheese
  fry the block of cheese
  roast the pork chop
  prepare meal



Your score has just gone up by one point.

>                                                  -= Kitchen =-3/11"""


def test_the_games_text_is_read_as_an_agent_reads_it_without_the_game():
    from race_core.envs.textworld.cooking import (
        clean_observation,
        game_command,
        objects_of,
        read_recipe,
        reasoning_kind,
    )

    text = clean_observation(BANNER_FEEDBACK.split("\n\n", 1)[1])
    assert text.startswith("You open the copy") and "score" not in text and "-= Kitchen" not in text
    assert read_recipe(text) == (["block of cheese", "pork chop"],
                                 ["dice the block of cheese", "fry the block of cheese", "roast the pork chop",
                                  "prepare meal"])
    assert clean_observation("You eat the meal.\n\n*** The End ***\n\nYou scored 8 out of 8") == "You eat the meal."
    assert objects_of("take knife from table") == ["knife", "table"] and objects_of("take carrot") == ["carrot"]
    assert objects_of("dice pork chop with knife") == ["pork chop", "knife"] and objects_of("go north") == []
    assert objects_of("open frosted-glass door") == ["frosted-glass door"]
    assert game_command("  Take  the KNIFE é ") == "take the knife" and len(game_command("a" * 500)) == 180
    assert [reasoning_kind(t) for t in ("", "Noted for later: the knife is here.", "I go west.",
                                        "The recipe needs carrot. Directions: slice the carrot, prepare meal.",
                                        "The meal is ready; I eat it.")] == [EMPTY, LATER, CURRENT, LATER, REDUNDANT]


def test_tasks_are_seeded_games_split_by_textworlds_own_food_split_and_compiled_once(cooking, one_room):
    from race_core.envs.textworld.cooking import game_file

    train, held_out = one_room
    assert [t.task_id for t in cooking.generate_tasks(3, 5, difficulty=1)] == [t.task_id for t in train]
    assert len({t.task_id for t in train + held_out}) == 5
    assert {t.game.split for t in train} == {"train"} and {t.game.split for t in held_out} == {"test"}
    assert not {t.question for t in train} & {t.question for t in held_out}
    for task in train:
        assert task.question.startswith("You are hungry!") and "-= Kitchen =-" in task.question
        assert "$$" not in task.question and "act[<command>]" in task.question  # no banner; the action form
        assert task.turn_budget == 20 and task.walkthrough[-1] == "eat meal"
    path = game_file(train[0].game)
    written = path.stat().st_mtime_ns
    assert game_file(train[0].game).stat().st_mtime_ns == written  # a second ask reads the cache
    assert not list(path.parent.glob(".compiling-*"))  # no half-written game left behind
    with pytest.raises(ValueError, match="difficulty must be None or one of"):
        cooking.generate_tasks(1, 0, difficulty=4)
    with pytest.raises(ValueError, match="difficulty 3 is not a tier of shape 'small'"):
        cooking.generate_tasks(1, 0, difficulty=3, shape="small")


def test_it_is_declared_as_a_plugin_and_the_stages_that_play_it_key_on_its_source_and_textworld(cooking):
    import textworld

    from race_core.envs import ENVIRONMENTS, installed_environments
    from tasks.fingerprints import stage_code

    assert "textworld-cooking" not in ENVIRONMENTS  # an entry point: race's other stages' keys ignore its file
    assert installed_environments()["textworld-cooking"] == "race_core.envs.textworld.cooking:TEXTWORLD_COOKING"
    code = stage_code("evaluate", {"env": "textworld-cooking"})
    assert code["libraries"]["textworld"] == textworld.__version__ and code["environment"]["source"]
    assert "textworld" not in stage_code("evaluate", {"env": "lookup"})["libraries"]


def test_the_games_judge_decides_the_budget_ends_it_and_the_tool_call_form_plays(cooking, one_room):
    from race_core.envs.textworld.cooking import INVALID_ACTION_OBSERVATION, expert_commands

    task = one_room[0][0]
    commands = expert_commands(task)
    episode = cooking.episode(task, 8)
    assert episode.max_turns == task.turn_budget  # the task's budget: a smaller max_turns cannot make it unwinnable
    assert episode.step("open sesame").observation == INVALID_ACTION_OBSERVATION  # not act[...]: a turn used
    for k, command in enumerate(commands):  # the call form of templates with tools is the same action
        action = (ToolCall("act", {"command": command}),) if k % 2 else f"act[{command}]"
        result = episode.step(action)
        assert "Your score" not in result.observation and "-= " not in result.observation.splitlines()[-1]
    assert result.done and episode.success and episode.reward == 1.0
    assert "The End" not in result.observation  # the end banner is cut, the game's last words kept

    spent = cooking.episode(task, 1)
    for _ in range(spent.max_turns):
        result = spent.step("act[look]")
    assert result.done and not spent.success and not spent.finished  # the budget spent is a failure
    assert spent.game is None  # the game is closed with the episode

    odd = cooking.episode(task, 8)  # what a policy may write: never an exception, never the interpreter's own
    for action in ("act[" + "a" + "\u00e9" * 150 + "]", "act[restart]", "act[UNDO]", "act[]"):
        observation = odd.step(action).observation
        assert "$$" not in observation and "TextWorld" not in observation
    assert odd.step("act[restart]").observation == INVALID_ACTION_OBSERVATION


def test_burning_an_ingredient_loses_the_game(cooking):
    from race_core.envs.textworld.cooking import GameParams, expert_commands, task_of

    task = task_of(GameParams(1, False, True, False, "train", 11))  # one ingredient to cook
    commands = expert_commands(task)
    cook = next(c for c in commands if c.startswith("cook "))
    episode = cooking.episode(task, 8)
    for command in commands[:commands.index(cook) + 1] + [cook]:  # cooked twice: burnt
        result = episode.step(f"act[{command}]")
    assert result.done and episode.finished and not episode.success and "burned" in result.observation


def test_the_expert_drops_the_walkthroughs_noise_and_notes_the_recipe_for_later(cooking):
    from race_core.envs.textworld.cooking import CookingExpert, generate_tasks, objects_of, read_recipe

    experts = cooking.expert_dataset(3, 5, difficulty=1, reasoning_kinds=True)
    assert len(experts) == 3 and {t.environment for t in experts} == {"textworld-cooking-v1"}
    for trajectory in experts:
        kinds = trajectory.extra["reasoning_kinds"]
        assert set(kinds) <= set(REASONING_KINDS)
        assert all(cooking.reasoning_kind(turn.reasoning) == kind
                   for turn, kind in zip(trajectory.turns, kinds, strict=True))
        actions = [turn.action for turn in trajectory.turns]
        assert "act[inventory]" not in actions and "act[drop knife]" not in actions  # the walkthrough's noise
        after_cookbook = actions.index("act[examine cookbook]") + 1
        ingredients, directions = read_recipe(trajectory.turns[after_cookbook - 1].observation)
        note = trajectory.turns[after_cookbook].reasoning
        assert kinds[after_cookbook] == LATER and all(part in note for part in ingredients + directions)
        assert set(kinds[:after_cookbook + 1]) <= {CURRENT, LATER}
        assert kinds[-1] in (REDUNDANT, EMPTY)
    for task in generate_tasks(3, 5, difficulty=1):  # a `later` note: not this turn's action's, a later one's
        expert = CookingExpert.for_task(task, random.Random(0))
        assert [c for c in task.walkthrough if c not in expert.commands]  # noise dropped (more than `inventory`)
        cooking.run_episode(task, expert, len(expert.commands))
        for k, kind in enumerate(expert.kinds):
            if kind == LATER and expert.commands[k - 1] != "examine cookbook":
                later = {t for c in expert.commands[k + 1:] for t in objects_of(c)}
                assert later - set(objects_of(expert.commands[k]))
    with pytest.raises(ValueError, match="empty_reasoning_share"):
        CookingExpert([], [], random.Random(0), 1.5)


def test_env_check_passes_the_cooking_games(cooking):
    from race_core.envs.check import check_environment

    result = check_environment("textworld-cooking", tasks=1, seed=5)
    assert result.ok, result.problems
    assert result.facts["expert_won"] == "1/1"


def test_a_real_policy_plays_held_out_games_through_the_evaluate_stage(cooking, smoke_policy, tmp_path):
    from race_core.config import EvalConfig, Resources
    from storage import ArtifactStore
    from tasks import training_stages
    from tasks.policy_ref import PolicyRef

    evaluated = training_stages.evaluate(ArtifactStore(tmp_path / "store"), PolicyRef.local(smoke_policy),
                                         EvalConfig(env="textworld-cooking", tasks=2, max_new_tokens=16),
                                         Resources())
    metrics = evaluated["metrics"]
    assert metrics["episodes"] == 2 and metrics["turns_per_episode"] >= 1  # the games were played, not skipped
