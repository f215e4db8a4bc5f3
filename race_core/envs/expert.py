"""Scripted calculator expert: bootstrap data only, never RACE input by default.

The expert is an ordinary agent: it reads the expression from the question, plans one `calc[...]`
per operation (innermost first, left operand before right), reads each result back from the
observation, substitutes it into later steps and ends with `finish[<result>]`. It never reads
`task.answer`. Its reasoning is deliberately verbose and redundant (restates the question and
earlier results) so that a cover has something to remove; a share of turns after the first has
empty reasoning so that a policy also learns the no-reasoning mode. Texts use a small vocabulary
(digits, + - * / ( ) = and a few English words) for tiny tokenizers.

`KindsExpertPolicy` (`expert_dataset(..., reasoning_kinds=True)`) is the expert whose reasoning can
matter, across turns or not, so that an ablation can tell a cover that checks every later action
from one that checks only the turn's own. It works some operations out in its head instead of
calling the calculator (+ - or * on two one-digit literals), and writes the result only in its
reasoning. Each turn's reasoning is of one kind, recorded per turn in the trajectory's
`extra["reasoning_kinds"]`:

- `later`: a result worked out now and used by a later action only (the turn's own action does
  not use it): removing it leaves this action as likely and makes a later one less likely. The
  turn that uses it does not restate its step (its reasoning is empty or only the results so
  far), so the note is the result's only source in the context.
- `current`: a result worked out now and used by this turn's action (an operand of its `calc`,
  or the number it finishes with).
- `redundant`: a restatement of the question, the results the observations already gave, and
  the next step (the only kind `ExpertPolicy` writes after turn 0): nothing an action needs.
- `empty`: no reasoning.

Turn 0 states the plan and also carries the notes due at turn 0; it is labelled by its notes
(`redundant` without any). The cover never removes turn 0's reasoning.
"""

from __future__ import annotations

import random
import re
from collections import defaultdict
from collections.abc import Callable, Sequence
from dataclasses import replace
from fractions import Fraction

from race_core.envs.base import (
    CURRENT,
    DEFAULT_EMPTY_REASONING_SHARE,
    EMPTY,
    EXPERT_SOURCE_REVISION,
    LATER,
    REASONING_KINDS,
    REDUNDANT,
    Episode,
)
from race_core.envs.calculator.evaluator import (
    BinOp,
    Node,
    Num,
    fold,
    format_value,
    parse_expression,
    parse_number,
)
from race_core.envs.calculator.tasks import (
    DEFAULT_MAX_TURNS,
    ENVIRONMENT_NAME,
    CalculatorTask,
    generate_tasks,
)
from race_core.schema import Trajectory, Turn

__all__ = ["CURRENT", "DEFAULT_EMPTY_REASONING_SHARE", "EMPTY", "EXPERT_SOURCE_REVISION", "LATER", "REASONING_KINDS",
           "REDUNDANT", "ExpertPolicy", "KindsExpertPolicy", "expert_dataset", "expert_episode", "reasoning_kind"]

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

    def _observed(self, question: str, turns: Sequence[Turn]) -> tuple[list[Fraction], Callable[[Node], str]]:
        """Read the question on the first turn; then the results the calculator told us, and the
        text of an operand (a literal, a result worked out so far, or `_known`)."""
        if not self.expression:
            self._read_question(question)
        results = [parse_number(t.observation) for t in turns]
        if any(r is None for r in results):
            raise RuntimeError(f"unexpected observation in expert episode: {[t.observation for t in turns]}")
        step_of = {id(op): k for k, op in enumerate(self.plan)}

        def operand(node: Node) -> str:
            if isinstance(node, Num):
                return _operand_text(node.value)
            known = self._known(node)
            return _operand_text(known if known is not None else results[step_of[id(node)]])

        return results, operand

    def _known(self, node: Node) -> Fraction | None:
        """A value the expert has without the calculator (none: it calls it for every operation)."""
        return None

    def __call__(self, question: str, turns: Sequence[Turn]) -> tuple[str, str]:
        results, operand = self._observed(question, turns)

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


MENTAL_OPS = "+-*"  # worked out in the head when both operands are one-digit literals
MENTAL_MAX_OPERAND = 9
DEFAULT_MENTAL_SHARE = 0.7  # of the eligible operations
DEFAULT_LATER_SHARE = 0.6  # of the mental results whose use is two or more turns away: noted early

_LATER_NOTE = ("I also work out {step} = {value} now; a later step needs it.",
               "Note for later: {step} = {value}.")
_HISTORY_TEMPLATE = "So far {history}."  # a restatement that leaves the next step unsaid
_CURRENT_NOTE = ("I work out {step} = {value}, which this step needs.",
                 "{step} = {value}, so I use {value} now.")


def _note_pattern(templates: Sequence[str]) -> re.Pattern[str]:
    parts = [re.escape(t).replace(re.escape("{step}"), r".+?").replace(re.escape("{value}"), r"\S+")
             for t in templates]
    return re.compile("|".join(parts))


_LATER_RE, _CURRENT_RE = _note_pattern(_LATER_NOTE), _note_pattern(_CURRENT_NOTE)


def reasoning_kind(reasoning: str) -> str:
    """The kind of a reasoning text written the kinds expert's way, read from the text alone (a policy
    trained on that expert writes the same notes): a `later` note wins over a `current` one, as in
    the labels `KindsExpertPolicy` records; any other text is `redundant`, no text `empty`."""
    if not reasoning:
        return EMPTY
    if _LATER_RE.search(reasoning):
        return LATER
    return CURRENT if _CURRENT_RE.search(reasoning) else REDUNDANT


class KindsExpertPolicy(ExpertPolicy):
    """The expert with reasoning of the kinds in the module docstring. `kinds[t]` is turn t's."""

    def __init__(self, rng: random.Random, empty_reasoning_share: float = DEFAULT_EMPTY_REASONING_SHARE,
                 mental_share: float = DEFAULT_MENTAL_SHARE, later_share: float = DEFAULT_LATER_SHARE):
        super().__init__(rng, empty_reasoning_share)
        for name, share in (("mental_share", mental_share), ("later_share", later_share)):
            if not 0.0 <= share <= 1.0:
                raise ValueError(f"{name} must be in [0, 1], got {share}")
        self.mental_share = mental_share
        self.later_share = later_share
        self.mental: set[int] = set()  # id() of the operations worked out in the head
        self.notes: dict[int, list[tuple[str, BinOp]]] = defaultdict(list)  # turn -> (kind, operation)
        self.carried: set[int] = set()  # id() of the mental results noted at an earlier turn (`later`)
        self.kinds: list[str] = []

    def _read_question(self, question: str) -> None:
        super()._read_question(question)
        parents = {id(child): op for op in self.plan for child in (op.left, op.right)}
        eligible = [op for op in self.plan if op.op in MENTAL_OPS and all(
                    isinstance(x, Num) and abs(x.value) <= MENTAL_MAX_OPERAND for x in (op.left, op.right))]
        self.mental = {id(op) for op in eligible if self.rng.random() < self.mental_share}
        full_plan = self.plan
        self.plan = [op for op in full_plan if id(op) not in self.mental]  # the calc steps
        step_of = {id(op): k for k, op in enumerate(self.plan)}
        for op in full_plan:
            if id(op) not in self.mental:
                continue
            parent = parents.get(id(op))  # never mental itself: it has an operation as an operand
            use = step_of[id(parent)] if parent is not None else len(self.plan)  # the root: the finish turn
            if use >= 2 and self.rng.random() < self.later_share:
                self.notes[self.rng.randint(1, use - 1)].append((LATER, op))
                self.carried.add(id(op))
            else:
                self.notes[use].append((CURRENT, op))

    def _known(self, node: Node) -> Fraction | None:
        return fold(node) if id(node) in self.mental else None

    def __call__(self, question: str, turns: Sequence[Turn]) -> tuple[str, str]:
        results, operand = self._observed(question, turns)
        k = len(turns)
        final = fold(parse_expression(self.expression)) if k == len(self.plan) else None
        notes = [self.rng.choice(_LATER_NOTE if kind == LATER else _CURRENT_NOTE).format(
                 step=f"{operand(op.left)} {op.op} {operand(op.right)}", value=_operand_text(fold(op)))
                 for kind, op in self.notes.get(k, [])]
        if k < len(self.plan):
            op = self.plan[k]
            step = f"{operand(op.left)} {op.op} {operand(op.right)}"
            action = f"calc[{step}]"
        else:
            step = ""
            action = f"finish[{format_value(final)}]"
        kinds = {kind for kind, _ in self.notes.get(k, [])}
        if k == 0:
            opening = self.rng.choice(_FIRST_TEMPLATES).format(expr=self.expression, step=step or self.expression)
            reasoning = " ".join([opening, *notes])
        elif notes:
            reasoning = " ".join(notes)
        elif self.rng.random() < self.empty_reasoning_share:
            reasoning = ""
        else:  # a step that uses a carried result is not restated: its only source is the earlier note
            uses_carried = k < len(self.plan) and any(id(x) in self.carried for x in (op.left, op.right))
            reasoning = self._restatement(k, "" if uses_carried else step, operand, results)
        self.kinds.append(LATER if LATER in kinds else CURRENT if CURRENT in kinds else
                          REDUNDANT if reasoning else EMPTY)
        return reasoning, action

    def _restatement(self, k: int, step: str, operand, results: list) -> str:
        """Only what the question and the observations already say, and the next step (if `step`)."""
        done = [f"{operand(op.left)} {op.op} {operand(op.right)} = {format_value(results[j])}"
                for j, op in enumerate(self.plan[:k])]
        fields = {"expr": self.expression, "history": " and ".join(done), "last": format_value(results[-1]),
                  "step": step}
        if step:
            return self.rng.choice(_NEXT_TEMPLATES).format(**fields)
        if k < len(self.plan):
            return _HISTORY_TEMPLATE.format(**fields)
        return self.rng.choice(_FINISH_TEMPLATES).format(**fields)


def expert_episode(
    task: CalculatorTask,
    rng: random.Random,
    empty_reasoning_share: float = DEFAULT_EMPTY_REASONING_SHARE,
    max_turns: int = DEFAULT_MAX_TURNS,
) -> Episode:
    """Play one task with the scripted expert. Turn 0 always has reasoning; every later turn has
    empty reasoning with probability `empty_reasoning_share`."""
    return task.environment.run_episode(task, ExpertPolicy(rng, empty_reasoning_share), max_turns)


def expert_dataset(
    n: int,
    seed: int,
    difficulty: int | None = None,
    empty_reasoning_share: float = DEFAULT_EMPTY_REASONING_SHARE,
    source_revision: str = EXPERT_SOURCE_REVISION,
    reasoning_kinds: bool = False,
    shape: str = "random",
) -> list[Trajectory]:
    """Successful expert episodes on `generate_tasks(n, seed, difficulty, shape=shape)` as
    trajectories (deterministic given the arguments; failed episodes, if any, are left out).
    `reasoning_kinds`: played by `KindsExpertPolicy`, each turn's kind in `extra["reasoning_kinds"]`
    (with `shape="two-part"` every task has a result that can be carried to a later turn)."""
    rng = random.Random(f"expert:{seed}")
    out = []
    for task in generate_tasks(n, seed, difficulty, shape=shape):
        if not reasoning_kinds:
            episode = expert_episode(task, rng, empty_reasoning_share)
            if episode.success:
                out.append(episode.to_trajectory(environment=ENVIRONMENT_NAME, source_revision=source_revision))
            continue
        policy = KindsExpertPolicy(rng, empty_reasoning_share)
        episode = task.environment.run_episode(task, policy, DEFAULT_MAX_TURNS)
        if episode.success:
            trajectory = episode.to_trajectory(environment=ENVIRONMENT_NAME, source_revision=source_revision)
            out.append(replace(trajectory, extra={**trajectory.extra, "reasoning_kinds": policy.kinds}))
    return out
