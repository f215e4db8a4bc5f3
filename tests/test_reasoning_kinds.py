"""The expert whose reasoning can matter (issue 17): on generated episodes, each turn's recorded
kind is what its text and the actions say it is — a `later` note's result is used by a later
action and not by its own, a `current` note's by its own action, and a `redundant` restatement
holds no number the question, the observations and the actions do not already hold."""

import re
from collections import Counter
from fractions import Fraction

import pytest

from race_core.envs.calculator import generate_tasks, judge, parse_expression
from race_core.envs.calculator.evaluator import BinOp, fold
from race_core.envs.expert import CURRENT, EMPTY, LATER, REASONING_KINDS, REDUNDANT, expert_dataset

NUMBER = re.compile(r"-?\d+(?:/\d+)?")
NOTE = re.compile(r"= \(?(-?\d+(?:/\d+)?)\)?")


def numbers(text):
    return set(NUMBER.findall(text))


@pytest.fixture(scope="module")
def episodes():
    return expert_dataset(80, 5, reasoning_kinds=True, shape="two-part")


def test_every_kind_occurs_on_candidate_turns(episodes):
    assert len(episodes) == 80  # the expert never fails
    counts = Counter(kind for t in episodes for kind in t.extra["reasoning_kinds"][1:])
    assert set(counts) == set(REASONING_KINDS) and min(counts.values()) >= 10, counts
    for t in episodes:
        assert len(t.extra["reasoning_kinds"]) == len(t.turns)


def test_each_turn_is_the_kind_it_is_labelled(episodes):
    """One-digit results coincide with other numbers now and then, so the "not used" checks count."""
    later_own_action, later_said_before, later = 0, 0, 0
    for t in episodes:
        actions = [turn.action for turn in t.turns]
        for k, (kind, turn) in enumerate(zip(t.extra["reasoning_kinds"], t.turns, strict=True)):
            noted = NOTE.findall(turn.reasoning) if kind in (LATER, CURRENT) else []
            if kind == LATER:
                assert k >= 1 and noted
                value, later = noted[-1], later + 1
                assert any(value in numbers(a) for a in actions[k + 1:])  # a later action uses it
                later_own_action += value in numbers(actions[k])  # its own does not (but for coincidences)
                later_said_before += value in {n for turn in t.turns[:k] for n in numbers(turn.observation)}
            elif kind == CURRENT:
                assert noted and noted[-1] in numbers(actions[k])
            elif kind == REDUNDANT and k >= 1:
                known = numbers(t.question) | numbers(" ".join(actions[:k + 1]))
                known |= {n for turn in t.turns[:k] for n in numbers(turn.observation)}
                assert numbers(turn.reasoning) <= known, (turn.reasoning, known)
            elif kind == EMPTY:
                assert turn.reasoning == ""
    assert later >= 10 and later_own_action <= later // 10 and later_said_before <= later // 10


def test_two_part_tasks_are_bounded_exact_and_judged_privately():
    tasks = generate_tasks(50, 9, shape="two-part")
    assert len({task.expression for task in tasks}) == 50 and {task.ops for task in tasks} == {4}
    for task in tasks:
        tree = parse_expression(task.expression)
        assert isinstance(tree, BinOp) and fold(tree) == task.answer
        assert judge(task, str(task.answer)) and not judge(task, str(task.answer + 1))
        assert all(abs(Fraction(n)) <= 99 for n in NUMBER.findall(task.expression))
    assert generate_tasks(50, 9, shape="two-part") == tasks
    with pytest.raises(ValueError, match="shape must be one of"):
        generate_tasks(1, 0, shape="tree")


def test_the_default_expert_is_unchanged_by_the_kinds_mode():
    plain = expert_dataset(6, 3)
    assert all("reasoning_kinds" not in t.extra for t in plain)
    assert plain == expert_dataset(6, 3, reasoning_kinds=False)
