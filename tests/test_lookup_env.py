"""The people-lookup environment (`race_core.envs.lookup`): tasks that need several turns by
construction, its private judge, its tools, and the scripted expert's labelled reasoning."""

from __future__ import annotations

import random
import re
from collections import Counter

import pytest

from race_core.envs import ENVIRONMENTS, environment_named, get_environment
from race_core.envs.agent import AgentPrompt
from race_core.envs.base import CURRENT, EMPTY, LATER, REDUNDANT, heldout_seed
from race_core.envs.lookup import (
    CALC_ERROR,
    ENVIRONMENT_NAME,
    INVALID_ACTION_OBSERVATION,
    LOOKUP,
    LookupExpert,
    calculate,
    generate_tasks,
    judge,
    parse_question,
)
from race_core.schema import ToolCall


def test_lookup_is_declared_and_known_by_its_trajectories_name():
    assert "lookup" in ENVIRONMENTS and get_environment("lookup") is LOOKUP
    assert environment_named(ENVIRONMENT_NAME) is LOOKUP
    assert environment_named("bounded-calculator-v1") is get_environment("calculator")
    with pytest.raises(ValueError, match="unknown environment 'nope'.*calculator.*lookup"):
        get_environment("nope")


def test_tasks_are_deterministic_and_split_by_question():
    a, b = generate_tasks(30, seed=4), generate_tasks(30, seed=4)
    assert [t.question for t in a] == [t.question for t in b] and [t.answer for t in a] == [t.answer for t in b]
    held = LOOKUP.heldout_tasks(30, seed=4)
    assert heldout_seed(4) > 4
    train_questions = {t.question for s in range(5) for t in generate_tasks(60, seed=s)}
    assert not train_questions & {t.question for t in held}
    assert all(t.task_id.startswith("lookup-") for t in a)
    with pytest.raises(ValueError, match="environment 'lookup': shape must be one of"):
        generate_tasks(1, 0, shape="two-part")
    with pytest.raises(ValueError, match="difficulty must be None or one of"):
        generate_tasks(1, 0, difficulty=2)
    assert {t.entries for t in generate_tasks(20, 1, difficulty=4)} == {4}


def test_no_task_can_be_won_in_fewer_than_four_turns():
    """Every number of the answer stands in one entry only, and a manager's or friend's name only in
    the entry that names them: a win reads at least three entries, one search per turn, then finishes."""
    for task in generate_tasks(200, seed=9):
        terms, _ = parse_question(task.question)
        needed = set()
        for term in terms:
            person = task.find(term.name)
            needed.add(person.name)
            if term.relation:
                other = person.related(term.relation)
                assert other not in task.question  # known only from the entry that names it
                needed.add(other)
        assert len(needed) == task.entries >= 3
    counts = Counter(t.kind for t in generate_tasks(400, seed=1))
    assert set(counts) == {"hop", "triple", "hop2"}


def test_the_environment_answers_searches_calcs_and_judges_privately():
    task = generate_tasks(1, seed=2)[0]
    env = LOOKUP.episode(task, max_turns=8)
    assert env.reset() == task.question and str(task.answer) not in task.question
    first = parse_question(task.question)[0][0].name
    entry = env.step(f"search[{first.lower()}]").observation  # names are found whatever their case
    assert entry.startswith(first + ": age ") and "manager " in entry and "best friend " in entry
    assert "No entry for 'Nobody Here'" in env.step("search[Nobody Here]").observation
    assert env.step("calc[12 + 7]").observation == "19"
    assert env.step("calc[12 + 7 * 2]").observation == CALC_ERROR  # one operation per call
    assert env.step((ToolCall("calc", {"expression": "-5 - 3"}),)).observation == "-8"
    assert env.step("jump").observation == INVALID_ACTION_OBSERVATION
    result = env.step(f"finish[{task.answer}]")
    assert result.done and env.success and env.reward == 1.0
    assert judge(task, str(task.answer)) and not judge(task, str(task.answer + 1)) and not judge(task, "1e3")
    assert calculate("7 * -3") == "-21" and calculate("7 / 3") == CALC_ERROR


def test_the_expert_wins_in_five_or_six_turns_and_labels_each_turns_reasoning():
    trajectories = LOOKUP.expert_dataset(120, seed=0, reasoning_kinds=True)
    assert len(trajectories) == 120  # the expert wins every task
    assert {len(t.turns) for t in trajectories} == {5, 6}
    kinds = Counter(k for t in trajectories for k in t.extra["reasoning_kinds"][1:])
    assert set(kinds) == {CURRENT, LATER, REDUNDANT, EMPTY}
    for t in trajectories:
        labels = t.extra["reasoning_kinds"]
        assert labels.count(LATER) == 1  # one number read early, used only by a later calc
        for k, (turn, label) in enumerate(zip(t.turns, labels, strict=True)):
            if k:
                assert LOOKUP.reasoning_kind(turn.reasoning) == label
            numbers = re.findall(r"-?\d+", turn.reasoning)
            if label == LATER:  # the note's number is not in this turn's action but in a later calc
                assert numbers[-1] not in turn.action_text
                assert any(numbers[-1] in later.action_text for later in t.turns[k + 1:])
            if label == CURRENT:
                assert any(word in turn.action_text for word in [*numbers, *re.findall(r"[A-Z][a-z]+ [A-Z][a-z]+",
                                                                                    turn.reasoning)])


def test_the_expert_reads_only_the_question_and_the_observations():
    task = generate_tasks(1, seed=5)[0]
    hidden = type(task)(task.task_id, task.question, -10**9, task.people, task.kind, task.entries)
    episode = LOOKUP.run_episode(hidden, LookupExpert(random.Random(0)), 8)
    assert not episode.success and episode.turns[-1].action == f"finish[{task.answer}]"


def test_tool_call_actions_round_trip_through_the_environments_tools(tiny_checkpoint):
    from race_core.policy import load_tokenizer
    from race_core.render import Renderer

    assert LOOKUP.text_to_call("search[Karo Velmi]") == (ToolCall("search", {"name": "Karo Velmi"}),)
    assert LOOKUP.action_as_text((ToolCall("search", {"name": "Karo Velmi"}),)) == "search[Karo Velmi]"
    assert LOOKUP.action_as_text((ToolCall("search", {"query": "x"}),)) == ""
    prompt = AgentPrompt.for_renderer(Renderer(load_tokenizer(tiny_checkpoint)), LOOKUP)
    assert prompt.environment == "lookup" and "search[<full name>]" in prompt.system
    tools = AgentPrompt(system="s", tools=LOOKUP.tool_schemas(), actions="tools", environment="lookup")
    assert tools.action("search[Karo Velmi]") == (ToolCall("search", {"name": "Karo Velmi"}),)


def test_the_cross_turn_figure_of_rows_read_back_from_parquet_is_plain_json(tmp_path):
    """Decision rows read from a decisions.parquet hold numpy scalars; the figure (written to
    ablation.json and the sweep's cross_turn.json) must still be counts and shares JSON can write."""
    import json

    import pandas as pd

    from race_core.decisions import cross_turn_figure

    rows = [  # rejected only by a later action; rejected by its own action; accepted; empty (not a candidate)
        {"skipped_empty": False, "accepted": False, "reason": "over_epsilon", "drops": [0.01, 0.4], "epsilon": 0.1},
        {"skipped_empty": False, "accepted": False, "reason": "over_epsilon", "drops": [0.3, 0.0], "epsilon": 0.1},
        {"skipped_empty": False, "accepted": True, "reason": "within_epsilon", "drops": [0.0, 0.05], "epsilon": 0.1},
        {"skipped_empty": True, "accepted": False, "reason": "empty", "drops": [], "epsilon": 0.1},
    ]
    pd.DataFrame(rows).to_parquet(tmp_path / "decisions.parquet")
    read = pd.read_parquet(tmp_path / "decisions.parquet").to_dict("records")
    figure = cross_turn_figure(read)
    assert figure == cross_turn_figure(rows) == {"candidates": 3, "rejected": 2, "rejected_by_later": 1,
                                                 "share": 1 / 3, "share_of_rejected": 0.5}
    assert json.loads(json.dumps(figure)) == figure
