"""Scripted calculator expert: bootstrap data only, never RACE input by default.

The expert is an ordinary agent: it reads the expression from the question, plans one `calc[...]`
per operation (innermost first, left operand before right), reads each result back from the
observation, substitutes it into later steps and ends with `finish[<result>]`. It never reads
`task.answer`. Its reasoning is deliberately verbose and redundant (restates the question and
earlier results) so that a cover has something to remove; a share of turns after the first has
empty reasoning so that a policy also learns the no-reasoning mode. Texts use a small vocabulary
(digits, + - * / ( ) = and a few English words) for tiny tokenizers.
"""

from __future__ import annotations

import random
import re
from collections.abc import Sequence
from fractions import Fraction

from race_core.envs.calculator import (
    DEFAULT_MAX_TURNS,
    ENVIRONMENT_NAME,
    BinOp,
    CalculatorTask,
    Episode,
    Node,
    Num,
    format_value,
    generate_tasks,
    parse_expression,
    parse_number,
    run_episode,
)
from race_core.schema import Trajectory, Turn

EXPERT_SOURCE_REVISION = "scripted-expert-1"
DEFAULT_EMPTY_REASONING_SHARE = 0.3

_QUESTION_RE = re.compile(r"Compute (?P<expression>[^.]+)\. Use calc\[")

_FIRST_TEMPLATES = (
    "The question asks for {expr}. I will work from the inside out. First I compute {step}.",
    "We need the value of {expr}. I use the calculator one step at a time, starting with {step}.",
    "To get {expr} I break it into steps. The first step is {step}.",
)
_NEXT_TEMPLATES = (
    "So far {history}. Next I compute {step}.",
    "The last result was {last}. Now I compute {step}.",
    "We still need {expr}. With {history}, the next step is {step}.",
)
_FINISH_TEMPLATES = (
    "The calculator gave {last}. So {expr} = {last}. I finish with {last}.",
    "All steps are done: {history}. The answer is {last}.",
    "{expr} is {last}. I will give the answer {last}.",
)


def _operand_text(value: Fraction) -> str:
    text = format_value(value)
    return f"({text})" if text.startswith("-") else text


def _post_order(node: Node, out: list[BinOp]) -> list[BinOp]:
    """Operations innermost first, left operand before right: one calc call each."""
    if isinstance(node, BinOp):
        _post_order(node.left, out)
        _post_order(node.right, out)
        out.append(node)
    return out


class ExpertPolicy:
    """A `run_episode` policy for one episode: (question, turns so far) -> (reasoning, action)."""

    def __init__(self, rng: random.Random, empty_reasoning_share: float = DEFAULT_EMPTY_REASONING_SHARE):
        if not 0.0 <= empty_reasoning_share <= 1.0:
            raise ValueError(f"empty_reasoning_share must be in [0, 1], got {empty_reasoning_share}")
        self.rng = rng
        self.empty_reasoning_share = empty_reasoning_share
        self.expression = ""
        self.plan: list[BinOp] = []

    def _read_question(self, question: str) -> None:
        match = _QUESTION_RE.search(question)
        if match is None:
            raise ValueError(f"not a calculator question: {question!r}")
        self.expression = match.group("expression").strip()
        self.plan = _post_order(parse_expression(self.expression), [])

    def __call__(self, question: str, turns: Sequence[Turn]) -> tuple[str, str]:
        if not self.plan:
            self._read_question(question)
        results = [parse_number(t.observation) for t in turns]  # what the calculator told us
        if any(r is None for r in results):
            raise RuntimeError(f"unexpected observation in expert episode: {[t.observation for t in turns]}")
        step_of = {id(op): k for k, op in enumerate(self.plan)}

        def operand(node: Node) -> str:
            if isinstance(node, Num):
                return _operand_text(node.value)
            return _operand_text(results[step_of[id(node)]])

        done_steps = [
            f"{operand(op.left)} {op.op} {operand(op.right)} = {format_value(results[k])}"
            for k, op in enumerate(self.plan[: len(turns)])
        ]
        fields = {
            "expr": self.expression,
            "history": " and ".join(done_steps),
            "last": format_value(results[-1]) if results else "",
        }
        k = len(turns)
        if k < len(self.plan):
            op = self.plan[k]
            fields["step"] = step = f"{operand(op.left)} {op.op} {operand(op.right)}"
            templates = _FIRST_TEMPLATES if k == 0 else _NEXT_TEMPLATES
            action = f"calc[{step}]"
        else:
            templates = _FINISH_TEMPLATES
            action = f"finish[{fields['last']}]"
        reasoning = self.rng.choice(templates).format(**fields)
        if k > 0 and self.rng.random() < self.empty_reasoning_share:
            reasoning = ""
        return reasoning, action


def expert_episode(
    task: CalculatorTask,
    rng: random.Random,
    empty_reasoning_share: float = DEFAULT_EMPTY_REASONING_SHARE,
    max_turns: int = DEFAULT_MAX_TURNS,
) -> Episode:
    """Play one task with the scripted expert. Turn 0 always has reasoning; every later turn has
    empty reasoning with probability `empty_reasoning_share`."""
    return run_episode(task, ExpertPolicy(rng, empty_reasoning_share), max_turns)


def expert_dataset(
    n: int,
    seed: int,
    difficulty: int | None = None,
    empty_reasoning_share: float = DEFAULT_EMPTY_REASONING_SHARE,
    source_revision: str = EXPERT_SOURCE_REVISION,
) -> list[Trajectory]:
    """Successful expert episodes on `generate_tasks(n, seed, difficulty)` as trajectories
    (deterministic given the arguments; failed episodes, if any, are left out)."""
    rng = random.Random(f"expert:{seed}")
    episodes = [expert_episode(t, rng, empty_reasoning_share) for t in generate_tasks(n, seed, difficulty)]
    return [
        e.to_trajectory(environment=ENVIRONMENT_NAME, source_revision=source_revision)
        for e in episodes
        if e.success
    ]
