"""The bounded calculator environment (docs/architecture.md §6).

`CalculatorEnv` (reset/step, used step by step by samplers) parses the agent's actions
`calc[<expression>]` and `finish[<number>]` and judges a finish privately (`tasks.judge`);
`run_episode` + `Episode` serve simple drivers. `Calculator` is the environment as the pipeline
sees it (`race_core.envs.base.Environment`): tasks, episodes, tools, the scripted expert.
"""

from __future__ import annotations

from race_core.envs.base import (
    DEFAULT_EMPTY_REASONING_SHARE,
    EXPERT_SOURCE_REVISION,
    FINISH_OBSERVATION,
    BudgetEpisode,
    Environment,
    Episode,
    PolicyFn,
    StepResult,
    bracketed,
)
from race_core.envs.calculator.agent import SPECS, SYSTEM_TEXT, SYSTEM_TOOLS
from race_core.envs.calculator.evaluator import evaluate
from race_core.envs.calculator.tasks import (
    DEFAULT_MAX_TURNS,
    ENV_REVISION,
    ENVIRONMENT_NAME,
    SHAPES,
    CalculatorTask,
    generate_tasks,
    judge,
)
from race_core.schema import Trajectory

__all__ = ["CALCULATOR", "DEFAULT_MAX_TURNS", "ENVIRONMENT_NAME", "ENV_REVISION", "FINISH_OBSERVATION",
           "INVALID_ACTION_OBSERVATION", "Calculator", "CalculatorEnv", "Episode", "PolicyFn", "StepResult",
           "run_episode"]


INVALID_ACTION_OBSERVATION = "Invalid action: expected calc[<expression>] or finish[<number>]."


class CalculatorEnv(BudgetEpisode):
    """One episode on one task. Each `step` uses one turn of the budget, whatever the action.

    `calc[<expr>]` observes the value or an error text; `finish[<number>]` ends the episode
    (judged privately; a finish that is not a number is a wrong answer); anything else observes
    INVALID_ACTION_OBSERVATION. A tool-call action is run as its text (`agent.action_as_text`: one
    call of calc or finish). When the budget is used up the episode ends unsuccessfully.
    """

    tools = SPECS

    def __init__(self, task: CalculatorTask, max_turns: int = DEFAULT_MAX_TURNS):
        super().__init__(task, max_turns)

    def act(self, text: str) -> str:
        if (expression := bracketed(text, "calc")) is not None:
            return evaluate(expression).text
        if (number := bracketed(text, "finish")) is not None:
            return self.finish(judge(self.task, number))
        return INVALID_ACTION_OBSERVATION


def run_episode(task: CalculatorTask, policy_fn: PolicyFn, max_turns: int = DEFAULT_MAX_TURNS) -> Episode:
    """Drive one episode: policy_fn(question, turns_so_far) -> (reasoning, action) until done."""
    return CALCULATOR.run_episode(task, policy_fn, max_turns)


class Calculator(Environment):
    """The bounded calculator as an `Environment`: tasks of 1-3 operations (`random`) or the
    two-part tasks whose results can be carried across turns (`two-part`)."""

    name = "calculator"
    environment = ENVIRONMENT_NAME
    revision = ENV_REVISION
    shapes = SHAPES
    difficulties = (1, 2, 3)
    tools = SPECS
    system_text = SYSTEM_TEXT
    system_tools = SYSTEM_TOOLS

    def generate_tasks(self, n: int, seed: int, difficulty: int | None = None, split: str | None = None,
                       shape: str = "random") -> list[CalculatorTask]:
        return generate_tasks(n, seed, difficulty, split, shape)

    def episode(self, task: CalculatorTask, max_turns: int) -> CalculatorEnv:
        return CalculatorEnv(task, max_turns)

    def expert_dataset(self, n: int, seed: int, difficulty: int | None = None,
                       empty_reasoning_share: float = DEFAULT_EMPTY_REASONING_SHARE,
                       source_revision: str = EXPERT_SOURCE_REVISION, reasoning_kinds: bool = False,
                       shape: str = "random") -> list[Trajectory]:
        from race_core.envs.expert import expert_dataset

        return expert_dataset(n, seed, difficulty, empty_reasoning_share, source_revision, reasoning_kinds, shape)

    def reasoning_kind(self, reasoning: str) -> str:
        from race_core.envs.expert import reasoning_kind

        return reasoning_kind(reasoning)


CALCULATOR = Calculator()
