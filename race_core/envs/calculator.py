"""Bounded calculator environment (DESIGN §6).

Three parts, top to bottom:

1. A safe evaluator: our own tokenizer and recursive-descent parser over + - * / (with × and ÷ as
   aliases), parentheses, unary minus, integer and decimal literals, computed exactly with
   `Fraction`. No eval/exec/compile/ast. Limits: expression length ≤ 64 characters, parenthesis
   nesting ≤ 8, |every literal and intermediate value| ≤ 1e12 (numerator and denominator).
   `evaluate` never raises: every failure is an `EvalResult` with an error text.
   Values are written as an integer when the denominator is 1, else as the reduced fraction
   "p/q" (`format_value`), never as a decimal, so observations are exact.
2. A seeded task generator: integer expressions with 1-3 operations of + - * and exact /,
   operands 0..99. Tasks are split by a hash of the expression into "train" and "heldout", so
   training and held-out tasks never share a question, whatever the seeds (`heldout_seed`).
3. The environment: `CalculatorEnv` (reset/step, used step by step by samplers), the private
   `judge` (the only reader of `task.answer`), and `run_episode` + `Episode` for simple drivers.
"""

from __future__ import annotations

import hashlib
import random
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from fractions import Fraction

from race_core.schema import Trajectory, Turn

ENVIRONMENT_NAME = "bounded-calculator-v1"
ENV_REVISION = "1"

MAX_EXPRESSION_CHARS = 64
MAX_NESTING = 8
MAX_ABS_VALUE = 10**12
DEFAULT_MAX_TURNS = 8

QUESTION_TEMPLATE = (
    "Compute {expression}. Use calc[<expression>] to evaluate expressions and finish[<number>] to answer."
)
INVALID_ACTION_OBSERVATION = "Invalid action: expected calc[<expression>] or finish[<number>]."
FINISH_OBSERVATION = "Episode finished."
ERROR_PREFIX = "Error: "


# ---------------------------------------------------------------------------------------------
# 1. Evaluator
# ---------------------------------------------------------------------------------------------


class EvalError(ValueError):
    """An expression the calculator refuses; the message is the observation text after 'Error: '."""


@dataclass(frozen=True)
class Num:
    value: Fraction


@dataclass(frozen=True)
class Neg:
    operand: Node


@dataclass(frozen=True)
class BinOp:
    op: str  # one of + - * / (aliases × ÷ are normalised at tokenization)
    left: Node
    right: Node


Node = Num | Neg | BinOp

_OPERATORS = {"+": "+", "-": "-", "*": "*", "/": "/", "×": "*", "÷": "/"}
_DIGITS = frozenset("0123456789")  # ASCII only: str.isdigit() also accepts '²' and other scripts


@dataclass(frozen=True)
class EvalResult:
    """Outcome of `evaluate`: exactly one of `value` and `error` is set."""

    value: Fraction | None
    error: str | None

    @property
    def ok(self) -> bool:
        return self.error is None

    @property
    def text(self) -> str:
        """The observation text: the formatted value, or 'Error: <reason>'."""
        if self.value is not None:
            return format_value(self.value)
        return ERROR_PREFIX + (self.error or "unknown")


def format_value(value: Fraction | int) -> str:
    """An integer when the denominator is 1, else the reduced fraction 'p/q' (sign on p)."""
    return str(Fraction(value))


def _tokenize(expr: str) -> list[tuple[str, Fraction | str, int]]:
    """Tokens as (kind, payload, position); kind is 'num', 'op', '(' or ')'."""
    tokens: list[tuple[str, Fraction | str, int]] = []
    i, n = 0, len(expr)
    while i < n:
        ch = expr[i]
        if ch.isspace():
            i += 1
        elif ch in _DIGITS:
            start = i
            while i < n and expr[i] in _DIGITS:
                i += 1
            if i < n and expr[i] == ".":
                i += 1
                if i >= n or expr[i] not in _DIGITS:
                    raise EvalError(f"malformed number at position {start}")
                while i < n and expr[i] in _DIGITS:
                    i += 1
            tokens.append(("num", _check_range(Fraction(expr[start:i])), start))
        elif ch in _OPERATORS:
            tokens.append(("op", _OPERATORS[ch], i))
            i += 1
        elif ch in "()":
            tokens.append((ch, ch, i))
            i += 1
        else:
            raise EvalError(f"unexpected character {ch!r} at position {i}")
    return tokens


class _Parser:
    """expr := term (('+'|'-') term)* ; term := unary (('*'|'/') unary)* ;
    unary := '-' unary | primary ; primary := number | '(' expr ')'."""

    def __init__(self, tokens: list[tuple[str, Fraction | str, int]]):
        self.tokens = tokens
        self.pos = 0
        self.depth = 0

    def parse(self) -> Node:
        if not self.tokens:
            raise EvalError("empty expression")
        node = self.expr()
        if self.pos < len(self.tokens):
            raise EvalError(f"unexpected {self._describe()}")
        return node

    def _peek(self) -> tuple[str, Fraction | str, int] | None:
        return self.tokens[self.pos] if self.pos < len(self.tokens) else None

    def _describe(self) -> str:
        tok = self._peek()
        if tok is None:
            return "end of expression"
        text = format_value(tok[1]) if tok[0] == "num" else tok[1]
        return f"{text!r} at position {tok[2]}"

    def expr(self) -> Node:
        node = self.term()
        while (tok := self._peek()) is not None and tok[0] == "op" and tok[1] in "+-":
            self.pos += 1
            node = BinOp(str(tok[1]), node, self.term())
        return node

    def term(self) -> Node:
        node = self.unary()
        while (tok := self._peek()) is not None and tok[0] == "op" and tok[1] in "*/":
            self.pos += 1
            node = BinOp(str(tok[1]), node, self.unary())
        return node

    def unary(self) -> Node:
        minus = 0
        while (tok := self._peek()) is not None and tok[0] == "op" and tok[1] == "-":
            self.pos += 1
            minus += 1
        node = self.primary()
        for _ in range(minus):
            node = Neg(node)
        return node

    def primary(self) -> Node:
        tok = self._peek()
        if tok is not None and tok[0] == "num":
            self.pos += 1
            return Num(tok[1])  # type: ignore[arg-type]
        if tok is not None and tok[0] == "(":
            self.depth += 1
            if self.depth > MAX_NESTING:
                raise EvalError(f"nesting deeper than {MAX_NESTING} parentheses")
            self.pos += 1
            node = self.expr()
            close = self._peek()
            if close is None or close[0] != ")":
                raise EvalError(f"expected ')' but found {self._describe()}")
            self.pos += 1
            self.depth -= 1
            return node
        raise EvalError(f"expected a number or '(' but found {self._describe()}")


def _check_range(value: Fraction) -> Fraction:
    if abs(value.numerator) > MAX_ABS_VALUE or value.denominator > MAX_ABS_VALUE:
        raise EvalError("value out of range (limit 1e12)")
    return value


def parse_expression(expr: str) -> Node:
    """Parse `expr` into a tree; raise `EvalError` on bad syntax or broken limits."""
    if len(expr) > MAX_EXPRESSION_CHARS:
        raise EvalError(f"expression longer than {MAX_EXPRESSION_CHARS} characters")
    return _Parser(_tokenize(expr)).parse()


def fold(node: Node) -> Fraction:
    """Exact value of a tree, left operand before right; raise `EvalError` on /0 or overflow."""
    if isinstance(node, Num):
        return _check_range(node.value)
    if isinstance(node, Neg):
        return -fold(node.operand)
    left, right = fold(node.left), fold(node.right)
    if node.op == "+":
        return _check_range(left + right)
    if node.op == "-":
        return _check_range(left - right)
    if node.op == "*":
        return _check_range(left * right)
    if right == 0:
        raise EvalError("division by zero")
    return _check_range(left / right)


def evaluate(expr: str) -> EvalResult:
    """Evaluate a calculator expression. Never raises; failures come back as `error`."""
    if not isinstance(expr, str):
        return EvalResult(None, "expression must be text")
    try:
        return EvalResult(fold(parse_expression(expr)), None)
    except EvalError as exc:
        return EvalResult(None, str(exc))
    except (RecursionError, MemoryError, ArithmeticError, ValueError) as exc:  # defence in depth
        return EvalResult(None, f"cannot evaluate ({type(exc).__name__})")


_NUMBER_RE = re.compile(r"[+-]?[0-9]+(?:\.[0-9]+)?|[+-]?[0-9]+/[0-9]+")


def parse_number(text: str) -> Fraction | None:
    """An integer, 'p/q' or decimal as an exact Fraction; None for anything else (never raises)."""
    if not isinstance(text, str) or len(text) > MAX_EXPRESSION_CHARS:
        return None
    text = text.strip()
    if not _NUMBER_RE.fullmatch(text):
        return None
    try:
        return Fraction(text)
    except (ValueError, ZeroDivisionError):  # "p/0"
        return None


# ---------------------------------------------------------------------------------------------
# 2. Tasks
# ---------------------------------------------------------------------------------------------

HELDOUT_SEED_OFFSET = 10**15  # far above date-like or 32/53-bit random seeds
HELDOUT_PERCENT = 10  # share of the expression space reserved for held-out tasks
_MAX_OPERAND = 99


@dataclass(frozen=True)
class CalculatorTask:
    task_id: str
    question: str
    answer: Fraction  # private: read only by `judge`
    expression: str
    ops: int


def question_for(expression: str) -> str:
    """The prompt for an expression: contains the expression, nothing derived from the answer."""
    return QUESTION_TEMPLATE.format(expression=expression)


def task_split(expression: str) -> str:
    """'heldout' for a fixed ~10% of expressions (by sha256), 'train' for the rest."""
    bucket = int.from_bytes(hashlib.sha256(expression.encode("utf-8")).digest()[:4], "big") % 100
    return "heldout" if bucket < HELDOUT_PERCENT else "train"


def heldout_seed(seed: int) -> int:
    """The held-out seed paired with a training seed. `generate_tasks` treats any seed
    ≥ HELDOUT_SEED_OFFSET as held-out and draws only held-out expressions for it, so its tasks
    share no question with tasks of any training seed."""
    return seed + HELDOUT_SEED_OFFSET


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


def generate_tasks(
    n: int, seed: int, difficulty: int | None = None, split: str | None = None
) -> list[CalculatorTask]:
    """`n` distinct tasks drawn with `random.Random(seed)`; deterministic given the arguments.

    difficulty: the number of operations (1, 2 or 3); None draws it uniformly per task.
    split: 'train' or 'heldout' (see `task_split`); None means 'heldout' for seeds
    ≥ HELDOUT_SEED_OFFSET (see `heldout_seed`) and 'train' otherwise.
    task_id is derived from the expression, so the same task has the same id in every draw.
    """
    if difficulty not in (None, 1, 2, 3):
        raise ValueError(f"difficulty must be None, 1, 2 or 3, got {difficulty!r}")
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
        ops = difficulty if difficulty is not None else rng.randint(1, 3)
        tree, answer = _random_tree(rng, ops)
        expression = _render(tree)
        if expression in seen or task_split(expression) != split:
            continue
        seen.add(expression)
        digest = hashlib.sha256(expression.encode("utf-8")).hexdigest()[:16]
        tasks.append(CalculatorTask(f"calc-{digest}", question_for(expression), answer, expression, ops))
    return tasks


# ---------------------------------------------------------------------------------------------
# 3. Environment, judge, episodes
# ---------------------------------------------------------------------------------------------


def judge(task: CalculatorTask, finish_value_text: str) -> bool:
    """Private success check: the finished number (integer, 'p/q' or decimal) equals the answer
    exactly. The only reader of `task.answer`."""
    value = parse_number(finish_value_text)
    return value is not None and value == task.answer


@dataclass(frozen=True)
class StepResult:
    observation: str
    done: bool


def _bracketed(action: str, name: str) -> str | None:
    """The text inside `name[...]`, or None when the action is not exactly that shape."""
    prefix = name + "["
    if action.startswith(prefix) and action.endswith("]"):
        return action[len(prefix) : -1]
    return None


class CalculatorEnv:
    """One episode on one task. Each `step` uses one turn of the budget, whatever the action.

    `calc[<expr>]` observes the value or an error text; `finish[<number>]` ends the episode
    (judged privately; a finish that is not a number is a wrong answer); anything else observes
    INVALID_ACTION_OBSERVATION. When the budget is used up the episode ends unsuccessfully.
    """

    def __init__(self, task: CalculatorTask, max_turns: int = DEFAULT_MAX_TURNS):
        if max_turns < 1:
            raise ValueError(f"max_turns must be at least 1, got {max_turns}")
        self.task = task
        self.max_turns = max_turns
        self.reset()

    def reset(self) -> str:
        """Start (again) and return the question: the only prompt the agent sees."""
        self.turns_used = 0
        self.finished = False
        self.success = False
        self.done = False
        return self.task.question

    @property
    def reward(self) -> float:
        return 1.0 if self.success else 0.0

    def step(self, action: str) -> StepResult:
        """Apply one action. Never raises for any text; raises RuntimeError once the episode is over."""
        if self.done:
            raise RuntimeError("the episode is over; call reset() to start again")
        self.turns_used += 1
        text = action.strip() if isinstance(action, str) else ""
        expression = _bracketed(text, "calc")
        number = _bracketed(text, "finish")
        if expression is not None:
            observation = evaluate(expression).text
        elif number is not None:
            self.finished = True
            self.success = judge(self.task, number)
            observation = FINISH_OBSERVATION
        else:
            observation = INVALID_ACTION_OBSERVATION
        self.done = self.finished or self.turns_used >= self.max_turns
        return StepResult(observation, self.done)


@dataclass
class Episode:
    """One played episode. Only successful ones become training trajectories."""

    task_id: str
    question: str
    turns: list[Turn]
    success: bool
    reward: float
    finished: bool

    def to_trajectory(
        self, environment: str = ENVIRONMENT_NAME, source_revision: str = f"env-r{ENV_REVISION}"
    ) -> Trajectory:
        """The episode as a validated `Trajectory` (DESIGN §2). Raises ValueError for a failed
        episode (only successful trajectories are RACE inputs) and `SchemaError` for a turn
        that breaks the contract (e.g. an empty action)."""
        if not self.success:
            raise ValueError(
                f"episode {self.task_id} failed; only successful episodes become trajectories "
                "(use .turns to inspect it)"
            )
        record = {
            "question": self.question,
            "environment": environment,
            "source_revision": source_revision,
            "split": "train",
            "successful": True,
            "turns": [t.to_dict() for t in self.turns],
            "task_id": self.task_id,
        }
        return Trajectory.from_dict(record)


PolicyFn = Callable[[str, Sequence[Turn]], tuple[str, str]]


def run_episode(task: CalculatorTask, policy_fn: PolicyFn, max_turns: int = DEFAULT_MAX_TURNS) -> Episode:
    """Drive one episode: policy_fn(question, turns_so_far) -> (reasoning, action) until done."""
    env = CalculatorEnv(task, max_turns)
    question = env.reset()
    turns: list[Turn] = []
    done = False
    while not done:
        reasoning, action = policy_fn(question, tuple(turns))
        result = env.step(action)
        turns.append(Turn(reasoning=reasoning, action=action, observation=result.observation))
        done = result.done
    return Episode(task.task_id, question, turns, env.success, env.reward, env.finished)
