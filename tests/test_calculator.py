"""Bounded calculator (docs/architecture.md §6): safe evaluator, seeded tasks, environment, private judge."""

from __future__ import annotations

import ast
import os
import random
from dataclasses import replace
from fractions import Fraction
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from race_core.envs import calculator as calc
from race_core.envs.calculator import (
    FINISH_OBSERVATION,
    INVALID_ACTION_OBSERVATION,
    CalculatorEnv,
    evaluate,
    format_value,
    generate_tasks,
    heldout_seed,
    judge,
    parse_expression,
    question_for,
    run_episode,
)
from race_core.envs.expert import expert_episode
from race_core.schema import Trajectory

FAST = settings(max_examples=200, deadline=None)


# -- evaluator: fixed cases ---------------------------------------------------------------------


@pytest.mark.parametrize(
    "expr, expected",
    [
        ("1+2*3", 7),
        ("(1 + 2) * 3", 9),
        ("10 - 4 - 3", 3),
        ("100 / 10 / 5", 2),
        ("7/2", Fraction(7, 2)),
        ("-3 - -3", 0),
        ("-(2 + 3) * 4", -20),
        ("--5", 5),
        ("3 × 4 ÷ 6", 2),
        ("1.5 * 2", 3),
        ("  42  ", 42),
        ("((((((((1))))))))", 1),  # nesting 8 is allowed
        ("999999999999 + 1", 10**12),  # the bound itself is allowed
    ],
)
def test_evaluator_computes_exact_values(expr, expected):
    result = evaluate(expr)
    assert result.error is None and result.value == Fraction(expected)


@pytest.mark.parametrize(
    "expr, reason",
    [
        ("1/0", "division by zero"),
        ("5 / (3 - 3)", "division by zero"),
        ("9**9**9", "expected a number"),
        ("__import__('os')", "unexpected character"),
        ("x" * 10_000, "longer than 64"),
        ("(" * 1000 + "1" + ")" * 1000, "longer than 64"),
        ("(((((((((1)))))))))", "nesting deeper than 8"),
        ("999999 * 999999 * 2", "out of range"),
        ("1000000000001", "out of range"),
        ("", "empty expression"),
        ("2(3)", "unexpected"),
        ("(1 + 2", "expected ')'"),
        ("1 +", "expected a number"),
        ("1e3", "unexpected character"),
        ("²", "unexpected character"),
        ("1.", "malformed number"),
    ],
)
def test_evaluator_refuses_with_an_error_text(expr, reason):
    result = evaluate(expr)
    assert result.value is None and reason in result.error
    assert result.text.startswith("Error: ")


def test_evaluator_never_runs_code():
    marker = f"/tmp/pw{os.getpid()}"
    assert not os.path.exists(marker)
    for expr in (f"__import__('os').system('touch {marker}')", f"open('{marker}','w')"):
        assert len(expr) <= 64  # refused by the parser, not by the length limit
        assert evaluate(expr).error is not None
        env = CalculatorEnv(generate_tasks(1, 0)[0])
        assert env.step(f"calc[{expr}]").observation.startswith("Error: ")
    assert not os.path.exists(marker)


def test_values_format_as_integer_or_reduced_fraction():
    assert format_value(Fraction(84, 2)) == "42"
    assert format_value(Fraction(6, -4)) == "-3/2"
    assert evaluate("2/4").text == "1/2"


def test_evaluator_is_not_python_eval():
    """No module of the package calls builtin eval/exec/compile/__import__ or imports ast."""
    modules = sorted(Path(calc.__file__).parent.glob("*.py"))
    assert {m.name for m in modules} >= {"__init__.py", "evaluator.py", "tasks.py", "environment.py"}
    for module in modules:
        tree = ast.parse(module.read_text(encoding="utf-8"))
        for node in ast.walk(tree):
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Name):
                assert node.func.id not in {"eval", "exec", "compile", "__import__"}
            if isinstance(node, ast.Import | ast.ImportFrom):
                names = [a.name for a in node.names] + [getattr(node, "module", None) or ""]
                assert "ast" not in names


# -- evaluator: properties ----------------------------------------------------------------------

_SYMBOLS = {"+": ["+"], "-": ["-"], "*": ["*", "×"], "/": ["/", "÷"]}


class _Expected(Exception):
    pass


def _trees():
    leaves = st.integers(0, 99).map(lambda v: ("num", v))
    return st.recursive(
        leaves,
        lambda kids: st.one_of(
            st.tuples(st.just("neg"), kids),
            st.tuples(st.sampled_from("+-*/"), kids, kids),
        ),
        max_leaves=16,
    )


@st.composite
def _sized_tree(draw, leaves: int):
    """A random-shaped tree with exactly `leaves` operands: reaches the length/depth/range limits."""
    if leaves == 1:
        return ("num", draw(st.integers(0, 99)))
    split = draw(st.integers(1, leaves - 1))
    op = draw(st.sampled_from("+-*/"))
    return (op, draw(_sized_tree(split)), draw(_sized_tree(leaves - split)))


@st.composite
def _rendered(draw, tree):
    """Text for a tree: every binary operation in parentheses, random spaces and symbol aliases."""
    space = draw(st.sampled_from(["", " "]))
    if tree[0] == "num":
        return str(tree[1])
    if tree[0] == "neg":
        return "-" + draw(_rendered(tree[1]))
    op = draw(st.sampled_from(_SYMBOLS[tree[0]]))
    return f"({draw(_rendered(tree[1]))}{space}{op}{space}{draw(_rendered(tree[2]))})"


def _depth(tree) -> int:
    if tree[0] == "num":
        return 0
    if tree[0] == "neg":
        return _depth(tree[1])
    return 1 + max(_depth(tree[1]), _depth(tree[2]))


def _reference(tree) -> Fraction:
    """Exact arithmetic in the evaluator's order: left operand, then right, then the operation."""
    if tree[0] == "num":
        return Fraction(tree[1])
    if tree[0] == "neg":
        return -_reference(tree[1])
    a, b = _reference(tree[1]), _reference(tree[2])
    if tree[0] == "/" and b == 0:
        raise _Expected("division by zero")
    value = {"+": a + b, "-": a - b, "*": a * b, "/": a / b if b else None}[tree[0]]
    if abs(value.numerator) > 10**12 or value.denominator > 10**12:
        raise _Expected("out of range")
    return value


@FAST
@given(st.data())
def test_random_expressions_agree_with_exact_fractions(data):
    tree = data.draw(st.one_of(_trees(), st.integers(2, 20).flatmap(_sized_tree)))
    text = data.draw(_rendered(tree))
    result = evaluate(text)
    if len(text) > 64:
        assert "longer than 64" in result.error
    elif _depth(tree) > 8:
        assert "nesting deeper than 8" in result.error
    else:
        try:
            expected = _reference(tree)
        except _Expected as exc:
            assert result.value is None and str(exc) in result.error
        else:
            assert result.error is None and result.value == expected


@FAST
@given(st.text(max_size=200))
def test_evaluate_never_raises_on_any_text(text):
    result = evaluate(text)
    assert (result.value is None) != (result.error is None)


@FAST
@given(st.text(max_size=200))
def test_env_step_never_raises_on_any_text(text):
    env = CalculatorEnv(generate_tasks(1, 0)[0])
    for action in (text, f"calc[{text}]", f"finish[{text}]"):
        env.reset()
        result = env.step(action)
        assert isinstance(result.observation, str) and result.observation


# -- task generator -----------------------------------------------------------------------------


def test_generator_is_deterministic_given_the_seed():
    assert generate_tasks(50, 7) == generate_tasks(50, 7)
    assert generate_tasks(50, 7) != generate_tasks(50, 8)


def _ops_and_operands(node, ops, operands):
    if isinstance(node, calc.Num):
        operands.append(node.value)
    elif isinstance(node, calc.BinOp):
        ops.append(node)
        _ops_and_operands(node.left, ops, operands)
        _ops_and_operands(node.right, ops, operands)
    else:
        raise AssertionError("generated expressions have no unary minus")


@pytest.mark.parametrize("difficulty", [None, 1, 2, 3])
def test_generated_tasks_are_small_exact_integer_problems(difficulty):
    tasks = generate_tasks(300, 3, difficulty)
    assert len({t.question for t in tasks}) == len(tasks)
    for task in tasks:
        assert task.question == question_for(task.expression)
        assert 1 <= task.ops <= 3 and (difficulty is None or task.ops == difficulty)
        ops, operands = [], []
        tree = parse_expression(task.expression)
        _ops_and_operands(tree, ops, operands)
        assert len(ops) == task.ops
        assert all(0 <= v <= 99 and v.denominator == 1 for v in operands)
        for op in ops:  # every intermediate value is an integer, every division exact
            left, right = calc.fold(op.left), calc.fold(op.right)
            assert left.denominator == 1 and right.denominator == 1
            if op.op == "/":
                assert right != 0 and (left / right).denominator == 1
        assert task.answer == calc.fold(tree) and task.answer.denominator == 1
    if difficulty is None:
        assert {t.ops for t in tasks} == {1, 2, 3}
    assert any("/" in t.expression for t in tasks)


def test_training_and_heldout_tasks_share_no_question():
    for seed in (0, 1):
        train = {t.question for t in generate_tasks(500, seed)}
        heldout = {t.question for t in generate_tasks(500, heldout_seed(seed))}
        assert len(train) == len(heldout) == 500
        assert not train & heldout
    other_train = {t.question for t in generate_tasks(500, 12345)}
    assert not other_train & {t.question for t in generate_tasks(500, heldout_seed(0))}


def test_bad_difficulty_is_refused():
    with pytest.raises(ValueError):
        generate_tasks(1, 0, difficulty=4)


# -- environment and judge ----------------------------------------------------------------------


def _task(expression="6 * 7"):
    tree = parse_expression(expression)
    return calc.CalculatorTask("t", question_for(expression), calc.fold(tree), expression, 1)


def test_calc_observes_the_value_and_errors():
    env = CalculatorEnv(_task())
    assert env.reset() == question_for("6 * 7")
    assert env.step("  calc[ 6 * 7 ]  ") == calc.StepResult("42", False)
    assert env.step("calc[1/0]") == calc.StepResult("Error: division by zero", False)
    assert env.turns_used == 2


def test_invalid_actions_use_the_turn_budget():
    env = CalculatorEnv(_task(), max_turns=3)
    for action in ("hello", "calc(6*7)", "finish 42"):
        result = env.step(action)
        assert result.observation == INVALID_ACTION_OBSERVATION
    assert result.done and not env.success and not env.finished and env.reward == 0.0
    with pytest.raises(RuntimeError):
        env.step("finish[42]")


def test_finish_ends_the_episode_and_is_judged_privately():
    env = CalculatorEnv(_task())
    assert env.step("finish[42]") == calc.StepResult(FINISH_OBSERVATION, True)
    assert env.success and env.finished and env.reward == 1.0
    env.reset()
    assert env.step("finish[41]") == calc.StepResult(FINISH_OBSERVATION, True)
    assert not env.success and env.finished


def test_budget_exhaustion_ends_without_success():
    episode = run_episode(_task(), lambda q, turns: ("think", "calc[6 * 7]"), max_turns=8)
    assert len(episode.turns) == 8 and not episode.finished and not episode.success
    assert episode.reward == 0.0
    with pytest.raises(ValueError, match="failed"):
        episode.to_trajectory()


@pytest.mark.parametrize("text", ["42", "42.0", "84/2", " 42 ", "+42", "42.000"])
def test_judge_accepts_equal_numbers(text):
    assert judge(_task(), text)


@pytest.mark.parametrize("text", ["41", "42.5", "6*7", "forty-two", "", "84/0", "4_2", "1e3"])
def test_judge_rejects_other_text(text):
    assert not judge(_task(), text)


def test_successful_episode_becomes_a_valid_trajectory():
    policy = iter([("multiply", "calc[6 * 7]"), ("", "finish[42]")])
    episode = run_episode(_task(), lambda q, turns: next(policy))
    assert episode.success and episode.finished and episode.reward == 1.0
    trajectory = episode.to_trajectory()
    assert trajectory.environment == calc.ENVIRONMENT_NAME
    assert trajectory.successful and trajectory.split == "train"
    assert [t.observation for t in trajectory.turns] == ["42", FINISH_OBSERVATION]
    _assert_round_trips(trajectory)


def _assert_round_trips(trajectory):
    again = Trajectory.from_dict(trajectory.to_dict())
    assert again.id == trajectory.id and again.turns == trajectory.turns
    assert again.question == trajectory.question and again.extra["task_id"] == trajectory.extra["task_id"]


def test_answer_reaches_the_agent_only_through_its_own_calc_calls():
    rng = random.Random(0)
    for task in generate_tasks(200, 11):
        # the question is the template applied to the expression: nothing derived from the answer
        assert task.question == question_for(task.expression)
        episode = expert_episode(task, rng)
        for turn in episode.turns:
            action = turn.action.strip()
            if action.startswith("calc[") and action.endswith("]"):
                assert turn.observation == evaluate(action[5:-1]).text
            elif action.startswith("finish[") and action.endswith("]"):
                assert turn.observation == FINISH_OBSERVATION
            else:
                assert turn.observation == INVALID_ACTION_OBSERVATION


def test_environment_observations_do_not_depend_on_the_answer():
    task = _task("(3 + 4) * 6")
    wrong = replace(task, answer=task.answer + 1)
    actions = ["calc[3 + 4]", "what", "calc[7 * 6]", "finish[42]"]
    seen = []
    for t in (task, wrong):
        env = CalculatorEnv(t)
        seen.append((env.reset(), [env.step(a) for a in actions]))
    assert seen[0] == seen[1]
