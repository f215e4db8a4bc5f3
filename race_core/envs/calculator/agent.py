"""How a chat model is told to play the calculator: its two tools, `calc(expression)` and
`finish(answer)` (`CALCULATOR_TOOLS`), and the system prompt that describes them, in text form
(`SYSTEM_TEXT`: the model writes `calc[<expression>]` / `finish[<number>]` after `Action: `) or for
a chat template that renders tool calls (`SYSTEM_TOOLS`). `AgentPrompt` (`race_core.envs.agent`)
puts them in the form a checkpoint's template takes; its names are re-exported here.
"""

from __future__ import annotations

from race_core.envs.agent import BARE, TEXT, TOKENIZER_KEY, TOOLS, AgentPrompt
from race_core.envs.base import Tool, bracketed
from race_core.envs.base import action_as_text as _action_as_text
from race_core.envs.base import text_to_call as _text_to_call
from race_core.schema import Action, ToolCall

__all__ = ["BARE", "CALCULATOR_TOOLS", "SPECS", "SYSTEM_TEXT", "SYSTEM_TOOLS", "TEXT", "TOKENIZER_KEY", "TOOLS",
           "AgentPrompt", "action_as_text", "text_to_call"]

SPECS = (Tool("calc", "expression", "Evaluate an arithmetic expression of integers with + - * / and parentheses.",
              "for example (12 + 7) * 3"),
         Tool("finish", "answer", "Give the final answer and end the task.", "the number"))
CALCULATOR_TOOLS = tuple(tool.schema() for tool in SPECS)

_SYSTEM_HEAD = ("You are an agent that solves arithmetic tasks with a calculator, one step per turn. "
                "Every turn starts with your reasoning inside <think></think> (it may be empty), then one action.")
SYSTEM_TEXT = (_SYSTEM_HEAD + "\nWrite the action on a new line as `Action: calc[<expression>]` to evaluate an "
               "expression, or `Action: finish[<number>]` to give the answer.")
SYSTEM_TOOLS = _SYSTEM_HEAD + "\nThe action is one call of a tool: calc to evaluate an expression, finish to answer."

_bracketed = bracketed


def text_to_call(text: str) -> tuple[ToolCall, ...] | None:
    """`calc[e]` -> (calc {"expression": e},), `finish[n]` -> (finish {"answer": n},); else None."""
    return _text_to_call(text, SPECS)


def action_as_text(action: Action) -> str:
    """What the calculator runs: a text action as is; one call of calc / finish with its one string
    (or number) argument as `calc[...]` / `finish[...]`; anything else (several calls, another tool,
    other arguments) as "" (an invalid action)."""
    return _action_as_text(action, SPECS)
