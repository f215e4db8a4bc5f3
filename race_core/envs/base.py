"""The environment seam: what the pipeline asks of an agent environment.

An `Environment` is one object, found by `race_core.envs.get_environment` (race's own, declared in
`race_core.envs.ENVIRONMENTS`; an installed plug-in's entry point; or `module:attribute`):

- a seeded task generator with a train / held-out split by hash (`generate_tasks`, `heldout_tasks`):
  a task has a `task_id`, the `question` the agent sees, and whatever private state its judge reads;
- the episode (`episode(task, max_turns)`: `reset` / `step` / `success`), judged privately;
- its tools (`tools`: each `name[value]` as a text action, or a call `name({argument: value})`) and
  the system prompts that describe them (`system_text`, `system_tools`): `AgentPrompt.for_renderer`
  builds the prompt in the form the checkpoint's chat template takes tools;
- a scripted expert (`expert_dataset`) whose reasoning is labelled per turn by kind
  (`reasoning_kinds`; `reasoning_kind` reads a kind back from a text written the expert's way).

The renderer, the cover, the samplers and the trainers know nothing of which environment they serve:
a rollout plays `task.environment.episode(...)`, and the environment's name travels in the
trajectory's `environment` field.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from race_core.schema import Action, ToolCall, Trajectory, Turn

HELDOUT_SEED_OFFSET = 10**15  # far above date-like or 32/53-bit random seeds
EXPERT_SOURCE_REVISION = "scripted-expert-1"
DEFAULT_EMPTY_REASONING_SHARE = 0.3

LATER, CURRENT, REDUNDANT, EMPTY = "later", "current", "redundant", "empty"
REASONING_KINDS = (LATER, CURRENT, REDUNDANT, EMPTY)


def heldout_seed(seed: int) -> int:
    """The held-out seed paired with a training seed. An environment's `generate_tasks` treats any
    seed >= HELDOUT_SEED_OFFSET as held-out and draws only held-out tasks for it, so its tasks share
    no question with tasks of any training seed."""
    return seed + HELDOUT_SEED_OFFSET


class Task(Protocol):
    task_id: str
    question: str


@dataclass(frozen=True)
class StepResult:
    observation: str
    done: bool


class EpisodeState(Protocol):
    """One running episode: `reset` returns the question, each `step` uses one turn of the budget."""

    done: bool
    success: bool
    finished: bool

    def reset(self) -> str: ...

    def step(self, action: Action) -> StepResult: ...

    @property
    def reward(self) -> float: ...


@dataclass(frozen=True)
class Tool:
    """One tool of an environment: the text action `name[value]` is the call `name({argument: value})`."""

    name: str
    argument: str
    description: str
    argument_description: str

    def schema(self) -> dict[str, Any]:
        """The tool as a JSON schema, the form chat templates take `tools=` in."""
        return {"type": "function", "function": {
            "name": self.name, "description": self.description,
            "parameters": {"type": "object", "properties": {self.argument: {
                "type": "string", "description": self.argument_description}}, "required": [self.argument]}}}


def bracketed(action: str, name: str) -> str | None:
    """The text inside `name[...]`, or None when the action is not exactly that shape."""
    prefix = name + "["
    if action.startswith(prefix) and action.endswith("]"):
        return action[len(prefix):-1]
    return None


def text_to_call(text: str, tools: Sequence[Tool]) -> tuple[ToolCall, ...] | None:
    """`name[value]` of one of `tools` as the call `name({argument: value})`; None for other text."""
    text = text.strip()
    for tool in tools:
        if (value := bracketed(text, tool.name)) is not None:
            return (ToolCall(tool.name, {tool.argument: value}),)
    return None


def action_as_text(action: Action, tools: Sequence[Tool]) -> str:
    """What an environment runs: a text action as is; one call of one of `tools` with its one string
    (or number) argument as `name[value]`; anything else (several calls, another tool, other
    arguments) as "" (an invalid action)."""
    if isinstance(action, str):
        return action
    if len(action) != 1:
        return ""
    call = action[0]
    key = next((tool.argument for tool in tools if tool.name == call.name), None)
    value = call.arguments.get(key) if key and set(call.arguments) == {key} else None
    if isinstance(value, bool) or not isinstance(value, str | int | float):
        return ""
    return f"{call.name}[{value}]"


FINISH_OBSERVATION = "Episode finished."


class BudgetEpisode:
    """One episode on one task with a budget of turns: each `step` uses one turn, whatever the
    action. A tool-call action is run as its text (`action_as_text` over `tools`: one call of one of
    them); a subclass answers the text in `act` and ends the episode with `finish`. When the budget
    is used up the episode ends unsuccessfully."""

    tools: tuple[Tool, ...] = ()

    def __init__(self, task: Any, max_turns: int):
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

    def act(self, text: str) -> str:
        """The observation of one action's text (stripped; "" for an action that is no call of a tool)."""
        raise NotImplementedError

    def finish(self, success: bool) -> str:
        """End the episode, judged `success`; the observation of the finishing turn."""
        self.finished, self.success = True, success
        return FINISH_OBSERVATION

    def step(self, action: Action) -> StepResult:
        """Apply one action. Never raises for any text; raises RuntimeError once the episode is over."""
        if self.done:
            raise RuntimeError("the episode is over; call reset() to start again")
        self.turns_used += 1
        text = action_as_text(action, self.tools).strip() if isinstance(action, str | tuple) else ""
        observation = self.act(text)
        self.done = self.finished or self.turns_used >= self.max_turns
        return StepResult(observation, self.done)


PolicyFn = Callable[[str, Sequence[Turn]], tuple[str, str]]


@dataclass
class Episode:
    """One played episode. Only successful ones become training trajectories."""

    task_id: str
    question: str
    turns: list[Turn]
    success: bool
    reward: float
    finished: bool
    environment: str = ""  # the trajectory's `environment` (`Environment.run_episode` sets both)
    source_revision: str = ""

    def to_trajectory(self, environment: str = "", source_revision: str = "") -> Trajectory:
        """The episode as a validated `Trajectory` (docs/architecture.md §2). Raises ValueError for a failed
        episode (only successful trajectories are RACE inputs) and `SchemaError` for a turn
        that breaks the contract (e.g. an empty action)."""
        if not self.success:
            raise ValueError(
                f"episode {self.task_id} failed; only successful episodes become trajectories "
                "(use .turns to inspect it)"
            )
        record = {
            "question": self.question,
            "environment": environment or self.environment,
            "source_revision": source_revision or self.source_revision,
            "split": "train",
            "successful": True,
            "turns": [t.to_dict() for t in self.turns],
            "task_id": self.task_id,
        }
        return Trajectory.from_dict(record)


class Environment(ABC):
    """An agent environment (module docstring). Subclasses set the class attributes and implement
    the abstract methods; `race_core.envs.get_environment` finds the instance (module docstring)."""

    name: str  # what `--env` takes
    environment: str  # the `environment` field of the trajectories played in it
    revision: str
    shapes: tuple[str, ...] = ("random",)  # task shapes `generate_tasks` draws
    difficulties: tuple[int, ...] = ()  # values `difficulty` may take besides None
    tools: tuple[Tool, ...] = ()
    system_text: str = ""  # the system prompt where actions are text: the task, the turn format, `name[value]`
    system_tools: str = ""  # the system prompt where the chat template renders the tools as calls
    reasoning_kinds: tuple[str, ...] = REASONING_KINDS

    @property
    def source_revision(self) -> str:
        """The `source_revision` of on-policy episodes played in this environment."""
        return f"on-policy-env-r{self.revision}"

    def check(self, shape: str = "random", difficulty: int | None = None) -> None:
        """Fail with a message naming the bad option when this environment has no such tasks."""
        if shape not in self.shapes:
            raise ValueError(f"environment {self.name!r}: shape must be one of {self.shapes}, got {shape!r}")
        if difficulty is not None and difficulty not in self.difficulties:
            raise ValueError(f"environment {self.name!r}: difficulty must be None or one of "
                             f"{self.difficulties}, got {difficulty!r}")

    @abstractmethod
    def generate_tasks(self, n: int, seed: int, difficulty: int | None = None, split: str | None = None,
                       shape: str = "random") -> list[Any]:
        """`n` distinct tasks drawn with `seed` (deterministic); split None: held-out for seeds
        >= HELDOUT_SEED_OFFSET, else train."""

    def heldout_tasks(self, n: int, seed: int = 0, difficulty: int | None = None, shape: str = "random") -> list:
        """`n` held-out tasks (never drawn for training, whatever the training seed)."""
        return self.generate_tasks(n, heldout_seed(seed), difficulty, split="heldout", shape=shape)

    @abstractmethod
    def episode(self, task: Any, max_turns: int) -> EpisodeState:
        """A fresh episode of `task` with a budget of `max_turns` turns."""

    @abstractmethod
    def expert_dataset(self, n: int, seed: int, difficulty: int | None = None,
                       empty_reasoning_share: float = DEFAULT_EMPTY_REASONING_SHARE,
                       source_revision: str = EXPERT_SOURCE_REVISION, reasoning_kinds: bool = False,
                       shape: str = "random") -> list[Trajectory]:
        """The scripted expert's successful episodes of `generate_tasks(n, seed, difficulty, shape=shape)`;
        with `reasoning_kinds`, each turn's kind in `extra["reasoning_kinds"]`."""

    @abstractmethod
    def reasoning_kind(self, reasoning: str) -> str:
        """The kind of a reasoning text written the expert's way (one of `reasoning_kinds`)."""

    def text_to_call(self, text: str) -> tuple[ToolCall, ...] | None:
        return text_to_call(text, self.tools)

    def action_as_text(self, action: Action) -> str:
        return action_as_text(action, self.tools)

    def tool_schemas(self) -> tuple[dict[str, Any], ...]:
        return tuple(tool.schema() for tool in self.tools)

    def run_episode(self, task: Any, policy_fn: PolicyFn, max_turns: int) -> Episode:
        """Drive one episode: policy_fn(question, turns_so_far) -> (reasoning, action) until done."""
        env = self.episode(task, max_turns)
        question = env.reset()
        turns: list[Turn] = []
        done = False
        while not done:
            reasoning, action = policy_fn(question, tuple(turns))
            result = env.step(action)
            turns.append(Turn(reasoning=reasoning, action=action, observation=result.observation))
            done = result.done
        return Episode(task.task_id, question, turns, env.success, env.reward, env.finished, self.environment,
                       f"env-r{self.revision}")
