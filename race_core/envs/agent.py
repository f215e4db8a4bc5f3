"""How a chat model is told to play an environment: its system prompt, its tools and the form of its
actions (`AgentPrompt`).

An environment names its tools (`Environment.tools`). A chat checkpoint is given them the way its
chat template takes tools (`AgentPrompt.for_renderer`):

- `tools`: the template renders tool calls (`Renderer.tool_mode == "template"`): the schemas go to
  the template as `tools=`, each action is one call, rendered (and written by the model) in the
  template's own tool-call format, and the observation comes back as the template's tool result;
- `text`: the template has no tool rendering: the system message describes the actions and the
  model writes them as text, `name[value]`, after `Action: `.

In both, each turn opens with the reasoning block `<think>...</think>` (docs/architecture.md §3). The prompt a
policy was trained with travels with it, in its tokenizer's `tokenizer_config.json` (key
`race_agent`, written by `save_pretrained` like the chat template and covered by the model
digest), so whoever samples or evaluates the policy gives it the same prompt (`AgentPrompt.of`). A
tokenizer without one (the tiny policies this project builds) plays `BARE`: no system prompt, text
actions, the question alone naming them.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

from race_core.envs.base import text_to_call
from race_core.schema import Action, Trajectory

if TYPE_CHECKING:
    from race_core.envs.base import Environment

TOKENIZER_KEY = "race_agent"
TEXT, TOOLS = "text", "tools"
DEFAULT_ENVIRONMENT = "calculator"  # the environment of a prompt that names none


@dataclass(frozen=True)
class AgentPrompt:
    """The system prompt, the tools given to the template, the form of actions (`text` or `tools`)
    and the environment the prompt plays (a name `race_core.envs.get_environment` resolves)."""

    system: str = ""
    tools: tuple[dict[str, Any], ...] = ()
    actions: str = TEXT
    environment: str = DEFAULT_ENVIRONMENT

    def __post_init__(self) -> None:
        if self.actions not in (TEXT, TOOLS):
            raise ValueError(f"actions must be {TEXT!r} or {TOOLS!r}, got {self.actions!r}")
        object.__setattr__(self, "tools", tuple(self.tools))

    @classmethod
    def for_renderer(cls, renderer, env: Environment | None = None) -> AgentPrompt:
        """`env`'s prompt (default: the calculator's) in the form the renderer's chat template takes tools."""
        if env is None:
            from race_core.envs import get_environment

            env = get_environment(DEFAULT_ENVIRONMENT)
        from race_core.envs import environment_key

        if renderer.tool_mode == "template":
            return cls(system=env.system_tools, tools=env.tool_schemas(), actions=TOOLS, environment=environment_key(env))
        return cls(system=env.system_text, actions=TEXT, environment=environment_key(env))

    @classmethod
    def of(cls, tokenizer) -> AgentPrompt:
        """The prompt the tokenizer's policy was trained with (`BARE` when it carries none)."""
        stored = (getattr(tokenizer, "init_kwargs", None) or {}).get(TOKENIZER_KEY)
        if not stored:
            return BARE
        return cls(system=stored.get("system", ""), tools=tuple(stored.get("tools", ())),
                   actions=stored.get("actions", TEXT), environment=stored.get("environment", DEFAULT_ENVIRONMENT))

    def attach(self, tokenizer) -> None:
        """Record this prompt in the tokenizer: `save_pretrained` writes it beside the chat template.
        The environment is written only when it is not the default (a calculator policy's bytes stay
        what they were before environments had names)."""
        stored: dict[str, Any] = {"system": self.system, "tools": list(self.tools), "actions": self.actions}
        if self.environment != DEFAULT_ENVIRONMENT:
            stored["environment"] = self.environment
        tokenizer.init_kwargs[TOKENIZER_KEY] = stored

    def action(self, text_action: str) -> Action:
        """A text action (`name[value]` of one of the prompt's tools) in this prompt's form; other text
        stays text."""
        if self.actions == TEXT:
            return text_action
        from race_core.envs import get_environment

        return text_to_call(text_action, get_environment(self.environment).tools) or text_action

    def dress(self, trajectory: Trajectory) -> Trajectory:
        """The trajectory as this prompt's agent would have played it: its system prompt, tools and
        the form of its actions (for scripted expert episodes written with text actions)."""
        turns = tuple(replace(turn, action=self.action(turn.action)) if isinstance(turn.action, str) else turn
                      for turn in trajectory.turns)
        return replace(trajectory, system=self.system, tools=self.tools, turns=turns, id="")  # a new id


BARE = AgentPrompt()
