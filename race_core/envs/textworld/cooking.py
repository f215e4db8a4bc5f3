"""TextWorld's cooking games (`--env textworld-cooking`, extra `race-pipeline[textworld]`): the "First TextWorld
Problems" challenge, Microsoft's `textworld` game generator, played offline.

The agent starts somewhere in a house, hungry: it walks to the kitchen, reads the cookbook ("dice the
block of cheese, fry the block of cheese, slice the pork chop, roast the pork chop, prepare meal"),
finds and takes each ingredient (opening fridges and doors on the way), cuts and cooks each as the
recipe says (a knife; a stove fries, an oven roasts, a barbecue grills), then prepares and eats the
meal. The recipe, read once, decides actions many turns later: the shape the cover's cross-turn
check is for.

- Tasks: (ingredients 1-3 = `difficulty`, or drawn from the shape's tiers: `random` 1-3, `small` 1-2;
  rooms by size, which of open / cook / cut, the game's split, a game seed) from a seeded generator. Training tasks are games of textworld's `train` split;
  held-out tasks (seeds >= HELDOUT_SEED_OFFSET, or `split="heldout"`) are games of its `test` split:
  foods no training game has, and training foods prepared in ways no training game asks for. Each game is compiled on first use into a
  local cache (`games_dir()`: `$RACE_TEXTWORLD_GAMES`, else the user's cache folder), keyed by its
  parameters and textworld's version; a game file is written whole or not at all.
- The game's own judge: won is success; lost (a burnt ingredient), or the turn budget spent, is failure.
  The budget is the task size's (`TURN_BUDGET`), or the caller's `max_turns` where that is larger.
- One text tool, `act[<command>]` (the call `act({"command": ...})` for templates with tools);
  observations without the banner, the prompt's status line or the score's messages; the interpreter's
  own commands (restart, undo, save, ...) are invalid actions, and a command is cut to what the game
  reads (ASCII, `MAX_COMMAND` characters).
- The expert plays the game's walkthrough with its noise dropped (each step whose removal still wins,
  checked by replaying the game; reading the cookbook is kept: it is how an agent learns the recipe),
  and writes reasoning from what it has seen, labelled by kind: the recipe read from the cookbook
  (`later`: the takes, cuts and cooks after it follow it; the turn's own action may too), where an
  object a later action needs was seen when no observation shows it again before that action (`later`;
  before the recipe is read, only the kitchen's tools and places, not its foods), the step at hand
  (`current`), the inventory restated before the meal (`redundant`), or nothing (`empty`, a share of
  those turns).
"""

from __future__ import annotations

import hashlib
import os
import random
import re
import tempfile
import warnings
from collections.abc import Sequence
from contextlib import contextmanager
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from race_core.envs.base import (
    CURRENT,
    DEFAULT_EMPTY_REASONING_SHARE,
    EMPTY,
    EXPERT_SOURCE_REVISION,
    HELDOUT_SEED_OFFSET,
    LATER,
    REDUNDANT,
    BudgetEpisode,
    Environment,
    Tool,
    bracketed,
)
from race_core.envs.lookup import _pattern as template_pattern  # texts -> the pattern reading a kind back
from race_core.schema import Trajectory, Turn

ENVIRONMENT_NAME = "textworld-cooking-v1"
ENV_REVISION = "1"
GAMES_DIR_VARIABLE = "RACE_TEXTWORLD_GAMES"
INSTALL_HINT = "pip install 'race-pipeline[textworld]' (textworld; a C compiler builds its jericho)"

ROOMS = {1: 1, 2: 6, 3: 9}  # ingredients -> rooms of the house (textworld's `--go`)
TURN_BUDGET = {1: 20, 2: 36, 3: 60}  # ingredients -> turns of an episode (the expert needs 4-12, 8-20, 20-32)
INGREDIENT_WEIGHTS = (0.5, 0.35, 0.15)  # difficulty None: how often 1, 2 and 3 ingredients are drawn
SHAPE_TIERS = {"random": (1, 2, 3), "small": (1, 2)}  # a shape: the tiers (ingredients) its games are drawn from
SPLITS = {"train": "train", "heldout": "test"}  # our split -> textworld's

TOOLS = (Tool("act", "command", "Run one command in the game and see what happens.",
              "one game command, for example: go north, open fridge, take knife from table, examine cookbook"),)
QUESTION_TAIL = "\n\nActions: act[<command>], one game command per turn."
COOKBOOK = "examine cookbook"
MAX_COMMAND = 180  # characters of a command the game reads (the interpreter cuts at 198 bytes)
META_COMMANDS = frozenset({"restart", "restore", "save", "quit", "q", "undo", "script", "unscript", "transcript"})
RECIPE_MARK = "Ingredients:"  # in the cookbook's text, read where the cookbook is
INVALID_ACTION_OBSERVATION = "Invalid action: expected act[<command>], for example act[go north] or act[examine cookbook]."
_SYSTEM_HEAD = ("You play a text game: you are hungry and cook a meal by the recipe in the kitchen's cookbook. One "
                "command per turn. Each turn starts with your reasoning inside <think></think> (it may be empty), then "
                "one action.")
SYSTEM_TEXT = (_SYSTEM_HEAD + "\nWrite it on a new line: `Action: act[<command>]`, where the command is one the game "
               "understands: go <direction>, open <thing>, take <thing> (from <place>), examine cookbook, "
               "<cut> <food> with knife, cook <food> with <stove|oven|BBQ>, prepare meal, eat meal.")
SYSTEM_TOOLS = (_SYSTEM_HEAD + "\nThe action is one call of the act tool with one game command: go <direction>, open "
                "<thing>, take <thing> (from <place>), examine cookbook, <cut> <food> with knife, cook <food> with "
                "<stove|oven|BBQ>, prepare meal, eat meal.")


@dataclass(frozen=True)
class GameParams:
    """What a cooking game is made from; the key of its compiled file."""

    ingredients: int
    open: bool
    cook: bool
    cut: bool
    split: str  # textworld's: train or test
    seed: int

    @property
    def rooms(self) -> int:
        return ROOMS[self.ingredients]

    def settings(self) -> dict[str, Any]:
        return {"recipe": self.ingredients, "take": self.ingredients, "go": self.rooms, "open": self.open,
                "cook": self.cook, "cut": self.cut, "drop": False, "recipe_seed": 0, "split": self.split}

    def stem(self) -> str:
        flags = "".join(flag for flag, on in (("o", self.open), ("c", self.cook), ("u", self.cut)) if on)
        return f"{self.split}-r{self.ingredients}-g{self.rooms}-{flags or 'x'}-s{self.seed}"


@dataclass(frozen=True)
class CookingTask:
    task_id: str
    question: str
    game: GameParams
    walkthrough: tuple[str, ...]  # the game's own, noise included (read only by the expert)
    turn_budget: int

    @property
    def environment(self) -> TextWorldCooking:
        return TEXTWORLD_COOKING


def _textworld():
    try:
        import textworld
        from textworld.challenges.tw_cooking import cooking
        from textworld.generator import compile_game
    except ImportError as exc:
        raise ImportError(f"--env textworld-cooking needs the textworld package: {INSTALL_HINT}") from exc
    return textworld, cooking, compile_game


def games_dir() -> Path:
    """Where compiled games are kept: `$RACE_TEXTWORLD_GAMES`, else `$XDG_CACHE_HOME/race/textworld-games`
    (`~/.cache/...`), one folder per textworld version."""
    textworld, _, _ = _textworld()
    root = os.environ.get(GAMES_DIR_VARIABLE) or Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") \
        / "race" / "textworld-games"
    return Path(root).expanduser() / f"textworld-{textworld.__version__}"


@contextmanager
def _quiet():
    """Without jericho's warning that a TextWorld game is "not fully supported" (its change detection is
    off: nothing here uses it), given at every compile and start."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*is not fully supported")
        yield


def game_file(params: GameParams) -> Path:
    """The compiled game of `params` (its .z8; the .json beside it), compiled on first use. Concurrent
    callers may both compile (the same seed compiles to the same game); each moves whole files into
    place, the .z8 last, so a reader never sees half a game."""
    folder = games_dir()
    path = folder / f"{params.stem()}.z8"
    if path.exists() and path.with_suffix(".json").exists():  # the .json: the game's facts its judge reads
        return path
    textworld, cooking, compile_game = _textworld()
    folder.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=folder, prefix=".compiling-") as scratch:
        options = textworld.GameOptions()
        options.seeds = params.seed
        options.path = str(Path(scratch) / path.name)
        options.force_recompile = True
        options.file_ext = ".z8"
        with _quiet():
            compiled = Path(compile_game(cooking.make(params.settings(), options), options))
        os.replace(compiled.with_suffix(".json"), path.with_suffix(".json"))
        os.replace(compiled, path)  # last: its presence means the game is whole
    return path


class _Game:
    """One running game (textworld's environment), closed when the episode ends."""

    def __init__(self, params: GameParams):
        textworld, _, _ = _textworld()
        path = str(game_file(params))
        with _quiet():
            self.env = textworld.start(path, request_infos=textworld.EnvInfos(won=True, lost=True, description=True,
                                                                               objective=True))
            self.state = self.env.reset()

    def step(self, command: str) -> tuple[str, bool, bool]:
        """(observation, won, lost) of one command."""
        self.state, _, _ = self.env.step(command)
        return clean_observation(self.state.feedback), bool(self.state.won), bool(self.state.lost)

    def close(self) -> None:
        if self.env is not None:
            self.env.close()
            self.env = None


_PROMPT_LINE = re.compile(r"\n>[^\n]*$")  # the game's prompt and status bar ("> ... -= Kitchen =-3/11")
_SCORE_LINE = re.compile(r"^\s*Your score has just gone (?:up|down) by \w+ points?\.\s*$", re.M)
_END = re.compile(r"\*\*\* .*", re.S)  # "*** The End ***" / "*** You lost! ***" and what follows


def clean_observation(feedback: str) -> str:
    """The game's text as an agent reads it: no prompt or status line, no score messages, no end banner."""
    text = _END.sub("", _PROMPT_LINE.sub("", feedback.rstrip()))
    text = _SCORE_LINE.sub("", text)
    return re.sub(r"\n{3,}", "\n\n", text).strip()


def task_of(params: GameParams) -> CookingTask:
    """The task of one game: its question is the game's opening (objective and first room)."""
    game = _Game(params)
    try:
        question = f"{game.state.objective.strip()}\n\n{game.state.description.strip()}{QUESTION_TAIL}"
    finally:
        game.close()
    textworld, _, _ = _textworld()
    walkthrough = tuple(textworld.Game.load(str(game_file(params).with_suffix(".json"))).metadata["walkthrough"])
    digest = hashlib.sha256(params.stem().encode()).hexdigest()[:16]
    return CookingTask(f"tw-cooking-{digest}", question, params, walkthrough, TURN_BUDGET[params.ingredients])


def generate_tasks(n: int, seed: int, difficulty: int | None = None, split: str | None = None,
                   shape: str = "random") -> list[CookingTask]:
    """`n` distinct games drawn with `random.Random(seed)` (compiled on first use); deterministic given the
    arguments. difficulty: ingredients (1-3; None: drawn from the shape's tiers at `INGREDIENT_WEIGHTS`:
    `random` 1-3, `small` 1-2). split None: 'heldout' for seeds >= HELDOUT_SEED_OFFSET, else 'train'."""
    TEXTWORLD_COOKING.check(shape, difficulty)
    tiers = SHAPE_TIERS[shape]
    if difficulty is not None and difficulty not in tiers:
        raise ValueError(f"environment 'textworld-cooking': difficulty {difficulty} is not a tier of shape "
                         f"{shape!r} ({tiers})")
    if split is None:
        split = "heldout" if seed >= HELDOUT_SEED_OFFSET else "train"
    if split not in SPLITS:
        raise ValueError(f"split must be 'train' or 'heldout', got {split!r}")
    rng = random.Random(f"textworld-cooking:{split}:{seed}")
    drawn: dict[GameParams, None] = {}
    tasks: dict[str, CookingTask] = {}  # question -> task: two games opening alike would be one task to an agent
    while len(tasks) < n:
        ingredients = difficulty or rng.choices(tiers, INGREDIENT_WEIGHTS[:len(tiers)])[0]
        cook, cut = rng.random() < 0.5, rng.random() < 0.5
        if not (cook or cut):  # a recipe always asks for some preparation
            cook, cut = rng.choice(((True, False), (False, True), (True, True)))
        params = GameParams(ingredients, rng.random() < 0.5, cook, cut, SPLITS[split], rng.randrange(1, 2**31 - 1))
        if params not in drawn:
            drawn[params] = None
            task = task_of(params)
            tasks.setdefault(task.question, task)
    return list(tasks.values())


class CookingEpisode(BudgetEpisode):
    """One game with a budget of turns: the game's judge decides; the budget ends it as a failure."""

    tools = TOOLS

    def __init__(self, task: CookingTask, max_turns: int):
        if max_turns < 1:
            raise ValueError(f"max_turns must be at least 1, got {max_turns}")
        self.game: _Game | None = None
        super().__init__(task, max(max_turns, task.turn_budget))

    def reset(self) -> str:
        self.close()  # the game starts at the first command
        return super().reset()

    def act(self, text: str) -> str:
        command = game_command(bracketed(text, "act") or "")
        if not command or command.split()[0] in META_COMMANDS:
            return INVALID_ACTION_OBSERVATION
        if self.game is None:
            self.game = _Game(self.task.game)
        observation, won, lost = self.game.step(command)
        if won or lost:
            self.finish(won)
        return observation

    def step(self, action):
        result = super().step(action)
        if result.done:
            self.close()
        return result

    def close(self) -> None:
        if self.game is not None:
            self.game.close()
            self.game = None


def game_command(text: str) -> str:
    """A command as the game reads it: lower-case ASCII words, one space apart, at most MAX_COMMAND
    characters (the interpreter fails on a multi-byte character cut at its own limit)."""
    return " ".join(text.encode("ascii", "ignore").decode().lower().split())[:MAX_COMMAND].strip()


def play(task: CookingTask, commands: Sequence[str]) -> tuple[bool, list[str]]:
    """Whether `commands` win `task`'s game from its start, and their observations (stops at the end)."""
    game = _Game(task.game)
    observations: list[str] = []
    try:
        for command in commands:
            observation, won, lost = game.step(command)
            observations.append(observation)
            if won or lost:
                return won, observations
        return False, observations
    finally:
        game.close()


def expert_commands(task: CookingTask) -> list[str]:
    """The walkthrough without its noise: each step whose removal still wins the game (replayed) is
    dropped, one at a time from the start, as long as the cookbook is still read (in the kitchen) before
    the recipe's steps."""
    def wins_having_read(commands: list[str]) -> bool:
        won, observations = play(task, commands)
        return won and any(command == COOKBOOK and RECIPE_MARK in observation
                           for command, observation in zip(commands, observations, strict=False))

    commands = list(task.walkthrough)
    if not wins_having_read(commands):
        raise RuntimeError(f"the walkthrough of {task.task_id} ({task.game.stem()}) does not win its game "
                           "having read the cookbook")
    i = 0
    while i < len(commands):
        trial = commands[:i] + commands[i + 1:]
        if commands[i] != COOKBOOK and wins_having_read(trial):
            commands = trial
        else:
            i += 1
    return commands


# The expert's texts. A kind is read back from the text alone (`reasoning_kind`), as for the lookup world.
_RECIPE_NOTE = ("The recipe needs {ingredients}. Directions: {directions}.",
                "Noted from the cookbook: {ingredients}; {directions}.")
_SEEN_NOTE = ("Noted for later: {things} {verb} here.", "I keep in mind that {things} {verb} in this room.")
_GO = ("I go {direction}.", "Next I head {direction}.")
_OPEN = ("The {thing} is closed; I open it.", "I open the {thing}.")
_TAKE = ("The recipe needs the {food}; I take it.", "I take the {food} for the recipe.")
_TAKE_TOOL = ("I need the {thing} for the recipe; I take it.", "I take the {thing}.")
_PREPARE = ("The recipe says to {direction}: I {command}.", "Next step of the recipe: {direction}.")
_COOKBOOK = ("First I read the recipe in the cookbook.", "I read the cookbook to learn the recipe.")
_READY = ("I carry {inventory}: everything the recipe asks for is done.",
          "All the ingredients are prepared: {inventory}. Time to make the meal.")
_EAT = ("The meal is ready; I eat it.", "I have the meal, so I eat it.")
_OTHER = ("Next: {command}.",)

_LATER_RE = template_pattern(_RECIPE_NOTE + _SEEN_NOTE)
_CURRENT_RE = template_pattern(_GO + _OPEN + _TAKE + _TAKE_TOOL + _PREPARE + _COOKBOOK + _OTHER)

_COOKING = {"stove": "fry", "oven": "roast", "bbq": "grill"}
_COMMAND_OBJECTS = re.compile(r"^(?:take (?P<take>.+?)(?: from (?P<source>.+))?|open (?P<open>.+)"
                              r"|(?:cook|chop|dice|slice) (?P<food>.+?) with (?P<tool>.+))$")


def reasoning_kind(reasoning: str) -> str:
    """The kind of a reasoning text written the expert's way: a note kept for later (the recipe, where a
    needed object is), the step at hand, anything else `redundant`, no text `empty`."""
    if not reasoning:
        return EMPTY
    if _LATER_RE.match(reasoning):
        return LATER
    return CURRENT if _CURRENT_RE.match(reasoning) else REDUNDANT


def objects_of(command: str) -> list[str]:
    """The objects a game command names (what an agent must have seen to write it)."""
    match = _COMMAND_OBJECTS.match(command)
    if match is None:
        return []
    return [value for key, value in match.groupdict().items()
            if value and not (key == "source" and value == "ground")]


def _mentions(text: str, thing: str) -> bool:
    return re.search(rf"\b{re.escape(thing)}\b", text, re.I) is not None


def _listed(things: Sequence[str]) -> str:
    names = [f"the {t}" for t in things]
    return names[0] if len(names) == 1 else ", ".join(names[:-1]) + f" and {names[-1]}"


def read_recipe(observation: str) -> tuple[list[str], list[str]]:
    """(ingredients, directions) of the cookbook's text."""
    ingredients = re.search(rf"{RECIPE_MARK}\s*\n(.*?)\n\s*\n\s*Directions:", observation, re.S)
    directions = re.search(r"Directions:\s*\n(.*)", observation, re.S)
    if ingredients is None or directions is None:
        raise RuntimeError(f"unexpected cookbook text in expert episode: {observation!r}")
    lines = lambda block: [line.strip() for line in block.splitlines() if line.strip()]  # noqa: E731
    return lines(ingredients[1]), lines(directions[1])


class CookingExpert:
    """A `run_episode` policy for one game: plays `commands` (the walkthrough without its noise) and
    writes reasoning from the question and the observations it has seen; `observations` (those of the
    same commands, replayed) tell it which objects the agent will see again before it needs them.
    `kinds[t]` is turn t's kind. `for_task` builds one for a task."""

    def __init__(self, commands: Sequence[str], observations: Sequence[str], rng: random.Random,
                 empty_reasoning_share: float = DEFAULT_EMPTY_REASONING_SHARE):
        if not 0.0 <= empty_reasoning_share <= 1.0:
            raise ValueError(f"empty_reasoning_share must be in [0, 1], got {empty_reasoning_share}")
        self.commands = list(commands)
        self.observations = list(observations)
        self.rng = rng
        self.empty_reasoning_share = empty_reasoning_share
        self.kinds: list[str] = []
        self.noted: set[str] = set()
        self.directions: list[str] = []
        self.carried: list[str] = []
        matches = [m for c in self.commands if (m := _COMMAND_OBJECTS.match(c))]
        tools = {m["tool"] for m in matches if m["tool"]}
        self.foods = {m["take"] for m in matches if m["take"] and m["take"] not in tools}

    @classmethod
    def for_task(cls, task: CookingTask, rng: random.Random,
                 empty_reasoning_share: float = DEFAULT_EMPTY_REASONING_SHARE) -> CookingExpert:
        commands = expert_commands(task)
        _, observations = play(task, commands)
        return cls(commands, observations, rng, empty_reasoning_share)

    def _direction_of(self, food: str, verb: str) -> str:
        return next((d for d in self.directions if d.startswith(verb + " ") and food in d), f"{verb} the {food}")

    def _step_note(self, command: str) -> tuple[str, str]:
        """The reasoning of the step at hand (and its kind)."""
        pick = self.rng.choice
        words = command.split()
        match = _COMMAND_OBJECTS.match(command)
        if command == COOKBOOK:
            return pick(_COOKBOOK), CURRENT
        if words[0] == "go":
            return pick(_GO).format(direction=" ".join(words[1:])), CURRENT
        if match and match["open"]:
            return pick(_OPEN).format(thing=match["open"]), CURRENT
        if match and match["take"]:
            thing = match["take"]
            self.carried.append(thing)
            if any(thing in d for d in self.directions):
                return pick(_TAKE).format(food=thing), CURRENT
            return pick(_TAKE_TOOL).format(thing=thing), CURRENT
        if match and match["food"]:
            verb = _COOKING.get(match["tool"].lower(), words[0])
            return pick(_PREPARE).format(direction=self._direction_of(match["food"], verb), command=command), CURRENT
        if command not in ("prepare meal", "eat meal"):  # a command of another game kind: said as it is
            return pick(_OTHER).format(command=command), CURRENT
        if command == "prepare meal":
            foods = [t for t in self.carried if any(t in d for d in self.directions)] or self.carried
            text, kind = pick(_READY).format(inventory=_listed(foods)), REDUNDANT
        else:
            text, kind = pick(_EAT), REDUNDANT
        if self.rng.random() < self.empty_reasoning_share:
            return "", EMPTY
        return text, kind

    def _to_note(self, k: int, seen: str) -> list[str]:
        """The objects turn k notes for later: shown by the last observation (the start, a room entered, a
        container opened), used by a later command and not by this one, and shown by no observation
        between now and that use; foods only once the recipe is read (before it, the agent cannot know
        which it needs)."""
        if not (k == 0 or self.commands[k - 1].split()[0] in ("go", "open")):
            return []
        now = set(objects_of(self.commands[k]))
        first_use: dict[str, int] = {}
        for u in range(k + 1, len(self.commands)):
            for thing in objects_of(self.commands[u]):
                first_use.setdefault(thing, u)
        return [thing for thing, u in first_use.items()
                if thing not in now and thing not in self.noted and thing not in self.carried
                and (self.directions or thing not in self.foods) and _mentions(seen, thing)
                and not any(_mentions(text, thing) for text in self.observations[k:u])]

    def __call__(self, question: str, turns: Sequence[Turn]) -> tuple[str, str]:
        k = len(turns)
        if k >= len(self.commands):
            raise RuntimeError(f"the expert's {len(self.commands)} commands did not end the game")
        command = self.commands[k]
        seen = question if k == 0 else turns[-1].observation
        if k > 0 and self.commands[k - 1] == COOKBOOK:
            ingredients, self.directions = read_recipe(seen)
            reasoning = self.rng.choice(_RECIPE_NOTE).format(ingredients=", ".join(ingredients),
                                                             directions=", ".join(self.directions))
            kind = LATER
        elif noted := self._to_note(k, seen):
            self.noted.update(noted)
            reasoning = self.rng.choice(_SEEN_NOTE).format(things=_listed(noted), verb="is" if len(noted) == 1 else "are")
            kind = LATER
        else:
            reasoning, kind = self._step_note(command)
        if kind == LATER and command.startswith("take "):
            self.carried.append(_COMMAND_OBJECTS.match(command)["take"])
        self.kinds.append(kind)
        return reasoning, f"act[{command}]"


class TextWorldCooking(Environment):
    """TextWorld's cooking games as an `Environment` (module docstring)."""

    name = "textworld-cooking"
    environment = ENVIRONMENT_NAME
    revision = ENV_REVISION
    shapes = tuple(SHAPE_TIERS)
    difficulties = tuple(ROOMS)
    tools = TOOLS
    system_text = SYSTEM_TEXT
    system_tools = SYSTEM_TOOLS
    libraries = ("textworld",)  # its games are textworld's: the stages that play them key on its version

    def generate_tasks(self, n: int, seed: int, difficulty: int | None = None, split: str | None = None,
                       shape: str = "random") -> list[CookingTask]:
        return generate_tasks(n, seed, difficulty, split, shape)

    def episode(self, task: CookingTask, max_turns: int) -> CookingEpisode:
        return CookingEpisode(task, max_turns)

    def expert_dataset(self, n: int, seed: int, difficulty: int | None = None,
                       empty_reasoning_share: float = DEFAULT_EMPTY_REASONING_SHARE,
                       source_revision: str = EXPERT_SOURCE_REVISION, reasoning_kinds: bool = False,
                       shape: str = "random") -> list[Trajectory]:
        rng = random.Random(f"textworld-cooking-expert:{seed}")
        out = []
        for task in generate_tasks(n, seed, difficulty, shape=shape):
            policy = CookingExpert.for_task(task, rng, empty_reasoning_share)
            episode = self.run_episode(task, policy, len(policy.commands))
            if episode.success:
                trajectory = episode.to_trajectory(source_revision=source_revision)
                if reasoning_kinds:
                    trajectory = replace(trajectory, extra={**trajectory.extra, "reasoning_kinds": policy.kinds})
                out.append(trajectory)
        return out

    def reasoning_kind(self, reasoning: str) -> str:
        return reasoning_kind(reasoning)


TEXTWORLD_COOKING = TextWorldCooking()

