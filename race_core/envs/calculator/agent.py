"""How a chat model is told to play the calculator: its system prompt, its tools and the form of its
actions (`AgentPrompt`).

The environment has two tools, `calc(expression)` and `finish(answer)` (`CALCULATOR_TOOLS`). A chat
checkpoint is given them the way its chat template takes tools (`AgentPrompt.for_renderer`):

- `tools`: the template renders tool calls (`Renderer.tool_mode == "template"`): the schemas go to
  the template as `tools=`, each action is one call, rendered (and written by the model) in the
  template's own tool-call format, and the observation comes back as the template's tool result;
- `text`: the template has no tool rendering: the system message describes the two actions and the
  model writes them as text, `calc[<expression>]` / `finish[<number>]`, after `Action: `.

In both, each turn opens with the reasoning block `<think>...</think>` (DESIGN §3). The prompt a
policy was trained with travels with it, in its tokenizer's `tokenizer_config.json` (key
`race_agent`, written by `save_pretrained` like the chat template and covered by the model
digest), so whoever samples or evaluates the policy gives it the same prompt (`AgentPrompt.of`). A
tokenizer without one (the tiny policies this project builds) plays `BARE`: no system prompt, text
actions, the question alone naming them.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

from race_core.schema import Action, ToolCall, Trajectory

TOKENIZER_KEY = "race_agent"
TEXT, TOOLS = "text", "tools"

CALCULATOR_TOOLS: tuple[dict[str, Any], ...] = (
    {"type": "function", "function": {
        "name": "calc", "description": "Evaluate an arithmetic expression of integers with + - * / and parentheses.",
        "parameters": {"type": "object", "properties": {"expression": {"type": "string",
                                                                       "description": "for example (12 + 7) * 3"}},
                       "required": ["expression"]}}},
    {"type": "function", "function": {
        "name": "finish", "description": "Give the final answer and end the task.",
        "parameters": {"type": "object", "properties": {"answer": {"type": "string",
                                                                   "description": "the number"}},
                       "required": ["answer"]}}},
)

_SYSTEM_HEAD = ("You are an agent that solves arithmetic tasks with a calculator, one step per turn. "
                "Every turn starts with your reasoning inside <think></think> (it may be empty), then one action.")
SYSTEM_TEXT = (_SYSTEM_HEAD + "\nWrite the action on a new line as `Action: calc[<expression>]` to evaluate an "
               "expression, or `Action: finish[<number>]` to give the answer.")
SYSTEM_TOOLS = _SYSTEM_HEAD + "\nThe action is one call of a tool: calc to evaluate an expression, finish to answer."


@dataclass(frozen=True)
class AgentPrompt:
    """The system prompt, the tools given to the template, and the form of actions (`text` or `tools`)."""

    system: str = ""
    tools: tuple[dict[str, Any], ...] = ()
    actions: str = TEXT

    def __post_init__(self) -> None:
        if self.actions not in (TEXT, TOOLS):
            raise ValueError(f"actions must be {TEXT!r} or {TOOLS!r}, got {self.actions!r}")
        object.__setattr__(self, "tools", tuple(self.tools))

    @classmethod
    def for_renderer(cls, renderer) -> AgentPrompt:
        """The calculator's prompt in the form the renderer's chat template takes tools."""
        if renderer.tool_mode == "template":
            return cls(system=SYSTEM_TOOLS, tools=CALCULATOR_TOOLS, actions=TOOLS)
        return cls(system=SYSTEM_TEXT, actions=TEXT)

    @classmethod
    def of(cls, tokenizer) -> AgentPrompt:
        """The prompt the tokenizer's policy was trained with (`BARE` when it carries none)."""
        stored = (getattr(tokenizer, "init_kwargs", None) or {}).get(TOKENIZER_KEY)
        if not stored:
            return BARE
        return cls(system=stored.get("system", ""), tools=tuple(stored.get("tools", ())),
                   actions=stored.get("actions", TEXT))

    def attach(self, tokenizer) -> None:
        """Record this prompt in the tokenizer: `save_pretrained` writes it beside the chat template."""
        tokenizer.init_kwargs[TOKENIZER_KEY] = {"system": self.system, "tools": list(self.tools),
                                                "actions": self.actions}

    def action(self, text_action: str) -> Action:
        """A text action (`calc[...]`, `finish[...]`) in this prompt's form; other text stays text."""
        if self.actions == TEXT:
            return text_action
        return text_to_call(text_action) or text_action

    def dress(self, trajectory: Trajectory) -> Trajectory:
        """The trajectory as this prompt's agent would have played it: its system prompt, tools and
        the form of its actions (for scripted expert episodes written with text actions)."""
        turns = tuple(replace(turn, action=self.action(turn.action)) if isinstance(turn.action, str) else turn
                      for turn in trajectory.turns)
        return replace(trajectory, system=self.system, tools=self.tools, turns=turns, id="")  # a new id


BARE = AgentPrompt()


def _bracketed(action: str, name: str) -> str | None:
    """The text inside `name[...]`, or None when the action is not exactly that shape."""
    prefix = name + "["
    if action.startswith(prefix) and action.endswith("]"):
        return action[len(prefix):-1]
    return None


def text_to_call(text: str) -> tuple[ToolCall, ...] | None:
    """`calc[e]` -> (calc {"expression": e},), `finish[n]` -> (finish {"answer": n},); else None."""
    text = text.strip()
    if (expression := _bracketed(text, "calc")) is not None:
        return (ToolCall("calc", {"expression": expression}),)
    if (answer := _bracketed(text, "finish")) is not None:
        return (ToolCall("finish", {"answer": answer}),)
    return None


def action_as_text(action: Action) -> str:
    """What the environment runs: a text action as is; one call of calc / finish with its one string
    (or number) argument as `calc[...]` / `finish[...]`; anything else (several calls, another tool,
    other arguments) as "" (an invalid action)."""
    if isinstance(action, str):
        return action
    if len(action) != 1:
        return ""
    call = action[0]
    key = {"calc": "expression", "finish": "answer"}.get(call.name)
    value = call.arguments.get(key) if key and set(call.arguments) == {key} else None
    if isinstance(value, bool) or not isinstance(value, str | int | float):
        return ""
    return f"{call.name}[{value}]"
