"""The bounded calculator environment (DESIGN §6).

`CalculatorEnv` (reset/step, used step by step by samplers) parses the agent's actions
`calc[<expression>]` and `finish[<number>]` and judges a finish privately (`tasks.judge`);
`run_episode` + `Episode` serve simple drivers.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from race_core.envs.calculator.agent import _bracketed, action_as_text
from race_core.envs.calculator.evaluator import evaluate
from race_core.envs.calculator.tasks import CalculatorTask, judge
from race_core.schema import Action, Trajectory, Turn

ENVIRONMENT_NAME = "bounded-calculator-v1"
ENV_REVISION = "1"
DEFAULT_MAX_TURNS = 8

INVALID_ACTION_OBSERVATION = "Invalid action: expected calc[<expression>] or finish[<number>]."
FINISH_OBSERVATION = "Episode finished."


@dataclass(frozen=True)
class StepResult:
    observation: str
    done: bool


class CalculatorEnv:
    """One episode on one task. Each `step` uses one turn of the budget, whatever the action.

    `calc[<expr>]` observes the value or an error text; `finish[<number>]` ends the episode
    (judged privately; a finish that is not a number is a wrong answer); anything else observes
    INVALID_ACTION_OBSERVATION. A tool-call action is run as its text (`agent.action_as_text`: one
    call of calc or finish). When the budget is used up the episode ends unsuccessfully.
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

    def step(self, action: Action) -> StepResult:
        """Apply one action. Never raises for any text; raises RuntimeError once the episode is over."""
        if self.done:
            raise RuntimeError("the episode is over; call reset() to start again")
        self.turns_used += 1
        text = action_as_text(action).strip() if isinstance(action, str | tuple) else ""
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
