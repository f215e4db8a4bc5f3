"""Seeded task generator of the bounded calculator (docs/architecture.md §6) and its private judge.

Integer expressions with 1-3 operations of + - * and exact /, operands 0..99. Tasks are split by
a hash of the expression into "train" and "heldout", so training and held-out tasks never share a
question, whatever the seeds (`heldout_seed`). `judge` is the only reader of `task.answer`.
"""

from __future__ import annotations

import hashlib
import random
from dataclasses import dataclass
from fractions import Fraction

from race_core.envs.base import HELDOUT_SEED_OFFSET, heldout_seed
from race_core.envs.calculator.evaluator import BinOp, Neg, Node, Num, fold, format_value, parse_number

ENVIRONMENT_NAME = "bounded-calculator-v1"  # the trajectories' `environment` field
ENV_REVISION = "1"
DEFAULT_MAX_TURNS = 8

__all__ = ["HELDOUT_PERCENT", "HELDOUT_SEED_OFFSET", "QUESTION_TEMPLATE", "SHAPES", "CalculatorTask",
           "generate_tasks", "heldout_seed", "judge", "question_for", "task_split"]

QUESTION_TEMPLATE = (
    "Compute {expression}. Use calc[<expression>] to evaluate expressions and finish[<number>] to answer."
)

HELDOUT_PERCENT = 10  # share of the expression space reserved for held-out tasks
_MAX_OPERAND = 99


@dataclass(frozen=True)
class CalculatorTask:
    task_id: str
    question: str
    answer: Fraction  # private: read only by `judge`
    expression: str
    ops: int

    @property
    def environment(self):
        """The environment this task is played in (`race_core.envs.base.Environment`)."""
        from race_core.envs import get_environment

        return get_environment("calculator")


def question_for(expression: str) -> str:
    """The prompt for an expression: contains the expression, nothing derived from the answer."""
    return QUESTION_TEMPLATE.format(expression=expression)


def task_split(expression: str) -> str:
    """'heldout' for a fixed ~10% of expressions (by sha256), 'train' for the rest."""
    bucket = int.from_bytes(hashlib.sha256(expression.encode("utf-8")).digest()[:4], "big") % 100
    return "heldout" if bucket < HELDOUT_PERCENT else "train"


def _render(node: Node, parent_op: str | None = None, is_right: bool = False) -> str:
    """Minimal parentheses, but a right operand of equal precedence keeps its own, so that
    parsing the text back gives the same tree (and the same exact intermediate divisions)."""
    if isinstance(node, Num):
        return format_value(node.value)
    if isinstance(node, Neg):
        return "-" + _render(node.operand, "neg")
    text = f"{_render(node.left, node.op)} {node.op} {_render(node.right, node.op, True)}"
    prec = {"+": 1, "-": 1, "*": 2, "/": 2, "neg": 3}
    if parent_op is not None and (
        prec[node.op] < prec[parent_op] or (is_right and prec[node.op] == prec[parent_op])
    ):
        return f"({text})"
    return text


def _random_tree(rng: random.Random, ops: int) -> tuple[Node, Fraction]:
    """A tree with `ops` operations, integer operands 0..99, every division exact and by ≠ 0."""
    if ops == 0:
        value = rng.randint(0, _MAX_OPERAND)
        return Num(Fraction(value)), Fraction(value)
    op = rng.choice("+-*/")
    left_ops = rng.randint(0, ops - 1)
    right_ops = ops - 1 - left_ops
    if op == "/":
        for _ in range(20):
            right, r = _random_tree(rng, right_ops)
            if r == 0:
                continue
            if left_ops == 0:
                if abs(r) > _MAX_OPERAND:
                    continue
                q = rng.randint(1, _MAX_OPERAND // int(abs(r)))  # 0 / r would be a trivial task
                left, lv = Num(Fraction(q * abs(r))), Fraction(q * abs(r))
                return BinOp("/", left, right), lv / r
            left, lv = _random_tree(rng, left_ops)
            if lv != 0 and (lv / r).denominator == 1:
                return BinOp("/", left, right), lv / r
        op = rng.choice("+-*")  # no exact division found: another operation
    left, lv = _random_tree(rng, left_ops)
    right, r = _random_tree(rng, right_ops)
    value = lv + r if op == "+" else lv - r if op == "-" else lv * r
    return BinOp(op, left, right), value


def _two_part_tree(rng: random.Random) -> tuple[Node, Fraction]:
    """`(a op b) OP ((c / d) op2 e)`, the two parts in either order: an operation on two one-digit
    numbers (small enough to work out in one's head) whose result is needed only by the last step,
    beside a part that takes two calculator steps (its first a division, so no part of it is a
    pair of one-digit literals)."""
    a, b, d = rng.randint(0, 9), rng.randint(0, 9), rng.randint(1, 12)
    c, e = d * rng.randint(1, _MAX_OPERAND // d), rng.randint(10, _MAX_OPERAND)
    pair = BinOp(rng.choice("+-*"), Num(Fraction(a)), Num(Fraction(b)))
    part = BinOp(rng.choice("+-*"), BinOp("/", Num(Fraction(c)), Num(Fraction(d))), Num(Fraction(e)))
    left, right = (pair, part) if rng.random() < 0.5 else (part, pair)
    tree = BinOp(rng.choice("+-*"), left, right)
    return tree, fold(tree)


SHAPES = ("random", "two-part")


def generate_tasks(
    n: int, seed: int, difficulty: int | None = None, split: str | None = None, shape: str = "random"
) -> list[CalculatorTask]:
    """`n` distinct tasks drawn with `random.Random(seed)`; deterministic given the arguments.

    shape: `random` trees, or `two-part` (`_two_part_tree`, 4 operations; difficulty is ignored):
    the tasks where reasoning can carry a result to a later turn (`race_core.envs.expert`).
    difficulty: the number of operations (1, 2 or 3); None draws it uniformly per task.
    split: 'train' or 'heldout' (see `task_split`); None means 'heldout' for seeds
    ≥ HELDOUT_SEED_OFFSET (see `heldout_seed`) and 'train' otherwise.
    task_id is derived from the expression, so the same task has the same id in every draw.
    """
    if difficulty not in (None, 1, 2, 3):
        raise ValueError(f"difficulty must be None, 1, 2 or 3, got {difficulty!r}")
    if shape not in SHAPES:
        raise ValueError(f"shape must be one of {SHAPES}, got {shape!r}")
    if split is None:
        split = "heldout" if seed >= HELDOUT_SEED_OFFSET else "train"
    if split not in ("train", "heldout"):
        raise ValueError(f"split must be 'train' or 'heldout', got {split!r}")
    rng = random.Random(seed)
    tasks: list[CalculatorTask] = []
    seen: set[str] = set()
    attempts = 0
    while len(tasks) < n:
        attempts += 1
        if attempts > 200 * n + 1000:
            raise ValueError(f"could not draw {n} distinct {split} tasks of difficulty {difficulty}")
        if shape == "two-part":
            ops, (tree, answer) = 4, _two_part_tree(rng)
        else:
            ops = difficulty if difficulty is not None else rng.randint(1, 3)
            tree, answer = _random_tree(rng, ops)
        expression = _render(tree)
        if expression in seen or task_split(expression) != split:
            continue
        seen.add(expression)
        digest = hashlib.sha256(expression.encode("utf-8")).hexdigest()[:16]
        tasks.append(CalculatorTask(f"calc-{digest}", question_for(expression), answer, expression, ops))
    return tasks


def judge(task: CalculatorTask, finish_value_text: str) -> bool:
    """Private success check: the finished number (integer, 'p/q' or decimal) equals the answer
    exactly. The only reader of `task.answer`."""
    value = parse_number(finish_value_text)
    return value is not None and value == task.answer
