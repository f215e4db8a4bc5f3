"""Bounded calculator environment (docs/architecture.md §6); public surface (docs/architecture.md §11).

Four parts, each usable on its own:

1. `evaluator`: the safe expression parser and exact evaluator (no eval/exec), with its limits.
2. `tasks`: the seeded task generator, the train/held-out split and the private `judge`.
3. `environment`: `CalculatorEnv` (reset/step, used step by step by samplers), action parsing,
   `run_episode` + `Episode` for simple drivers, and `CALCULATOR`, the calculator as an
   `Environment` (`race_core.envs.base`).
4. `agent`: how a chat model is told to play: `AgentPrompt` (system prompt, `CALCULATOR_TOOLS`, text
   or tool-call actions), carried by a policy's tokenizer.

Every public name is re-exported here, so `from race_core.envs.calculator import X` works for all.
"""

from race_core.envs.calculator.agent import (
    BARE,
    CALCULATOR_TOOLS,
    AgentPrompt,
    action_as_text,
    text_to_call,
)
from race_core.envs.calculator.environment import (
    CALCULATOR,
    DEFAULT_MAX_TURNS,
    ENV_REVISION,
    ENVIRONMENT_NAME,
    FINISH_OBSERVATION,
    INVALID_ACTION_OBSERVATION,
    Calculator,
    CalculatorEnv,
    Episode,
    PolicyFn,
    StepResult,
    run_episode,
)
from race_core.envs.calculator.evaluator import (
    ERROR_PREFIX,
    MAX_ABS_VALUE,
    MAX_EXPRESSION_CHARS,
    MAX_NESTING,
    BinOp,
    EvalError,
    EvalResult,
    Neg,
    Node,
    Num,
    evaluate,
    fold,
    format_value,
    parse_expression,
    parse_number,
)
from race_core.envs.calculator.tasks import (
    HELDOUT_PERCENT,
    HELDOUT_SEED_OFFSET,
    QUESTION_TEMPLATE,
    SHAPES,
    CalculatorTask,
    generate_tasks,
    heldout_seed,
    judge,
    question_for,
    task_split,
)

__all__ = [
    "CALCULATOR",
    "Calculator",
    "AgentPrompt",
    "BARE",
    "CALCULATOR_TOOLS",
    "action_as_text",
    "text_to_call",
    "BinOp",
    "CalculatorEnv",
    "CalculatorTask",
    "DEFAULT_MAX_TURNS",
    "ENVIRONMENT_NAME",
    "ENV_REVISION",
    "ERROR_PREFIX",
    "Episode",
    "EvalError",
    "EvalResult",
    "FINISH_OBSERVATION",
    "HELDOUT_PERCENT",
    "HELDOUT_SEED_OFFSET",
    "INVALID_ACTION_OBSERVATION",
    "MAX_ABS_VALUE",
    "MAX_EXPRESSION_CHARS",
    "MAX_NESTING",
    "Neg",
    "Node",
    "Num",
    "PolicyFn",
    "QUESTION_TEMPLATE",
    "SHAPES",
    "StepResult",
    "evaluate",
    "fold",
    "format_value",
    "generate_tasks",
    "heldout_seed",
    "judge",
    "parse_expression",
    "parse_number",
    "question_for",
    "run_episode",
    "task_split",
]
