"""ScienceWorld (`--env scienceworld`, extra `race-pipeline[scienceworld]`, a Java runtime): the paper's
first environment, AllenAI's simulator of an elementary-school science curriculum, played offline.

The agent is in a house with a greenhouse, a workshop, a kitchen and the outside; a task asks it to
find a living thing and put it in a box, to measure a substance's temperature and file it by the
reading, to mix paints, ... (30 task types, each with hundreds of variations). One text command per
turn (`open door to kitchen`, `go to kitchen`, `look around`, `pick up thermometer`, `focus on ...`).

- Tasks: (task type, variation). The shape picks the task types (`random`: `SHORT_TASKS`, those whose
  expert paths fit the budget; `all`: every type; or one type by its name); training tasks are variations of
  the package's own train lists, held-out tasks (seeds >= HELDOUT_SEED_OFFSET, or `split="heldout"`)
  of its test lists. The question is the task's description and the first room as the simulator shows it.
- The judge is the simulator's score: 100 is success; a negative score (focusing on the wrong thing)
  ends the episode as a failure, as does the turn budget (`TURN_BUDGET`, the paper's 30, or the caller's
  `max_turns` where that is larger).
- One text tool, `act[<command>]` (the call `act({"command": ...})` for templates with tools); the
  observations are the simulator's own text. Each step runs only the command (the valid actions are
  never listed: that is what makes the package's own `step` slow).
- Simulators: one JVM each (about 1.1 GB), from a bounded pool (`SimulatorPool`,
  `$RACE_SCIENCEWORLD_SIMULATORS`, else what the machine's free memory and cores allow). An episode holds
  one while it plays; when more episodes play at once than the pool has simulators, the one idle longest
  gives its simulator up and, at its next step, gets one back with its task reloaded and its commands
  replayed.
- Stored, not regenerated: a variation's gold path can differ between two loads (an equally valid one),
  and the order in which a room lists its things can too. So each task's description, first room and
  gold path, and the expert's commands, are recorded once into a local cache (`cache_dir()`:
  `$RACE_SCIENCEWORLD_CACHE`, else the user's cache folder; one folder per scienceworld version, a file
  per task, written whole) and read from there after.
- The expert plays the gold path without its noise (`_clean_path`: cut at the win, without commands
  that changed nothing and without detours, with a `look around` where the path acts in a room it never
  looked at; replayed to a win, else the gold path), and writes reasoning from what it has seen,
  labelled by kind: where things a later command needs are, seen on looking around, when no observation
  shows them again before that command (`later`); the step at hand, or the reading just taken
  (`current`); the task restated on its last step (`redundant`); or nothing (`empty`, a share of those
  turns).
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import random
import re
import tempfile
import time
from collections.abc import Sequence
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
from race_core.envs.scienceworld.simulator import POOL, SimulatorPool, version
from race_core.schema import Trajectory, Turn

ENVIRONMENT_NAME = "scienceworld-v1"
ENV_REVISION = "1"
EXPERT_VERSION = "2"  # of `expert_commands`: a cached expert path of another version is made again
CACHE_VARIABLE = "RACE_SCIENCEWORLD_CACHE"
PROGRESS_INTERVAL_S = 15.0  # the expert's progress: a log line at most this often

TURN_BUDGET = 30  # the paper's: at most 30 turns an episode
TASK_TYPES = (  # scienceworld 1.2's 30 task types
    "boil", "change-the-state-of-matter-of", "chemistry-mix", "chemistry-mix-paint-secondary-color",
    "chemistry-mix-paint-tertiary-color", "find-animal", "find-living-thing", "find-non-living-thing", "find-plant",
    "freeze", "grow-fruit", "grow-plant", "identify-life-stages-1", "identify-life-stages-2",
    "inclined-plane-determine-angle", "inclined-plane-friction-named-surfaces",
    "inclined-plane-friction-unnamed-surfaces", "lifespan-longest-lived", "lifespan-longest-lived-then-shortest-lived",
    "lifespan-shortest-lived", "measure-melting-point-known-substance", "measure-melting-point-unknown-substance",
    "melt", "mendelian-genetics-known-plant", "mendelian-genetics-unknown-plant", "power-component",
    "power-component-renewable-vs-nonrenewable-energy", "test-conductivity", "test-conductivity-of-unknown-substances",
    "use-thermometer",
)
# The default shape's task types: those whose expert paths all fit the paper's 30 turns (4-21 turns on the
# test variations; find-* 13, lifespan-* 6, use-thermometer 17 on average), so a small model's episodes fit
# a CPU's context too; use-thermometer takes a reading that decides, turns later, which box a substance goes
# in. Not test-conductivity: 33 of its 225 test variations need 31-43 turns.
SHORT_TASKS = (
    "find-animal", "find-living-thing", "find-non-living-thing", "find-plant", "lifespan-longest-lived",
    "lifespan-shortest-lived", "lifespan-longest-lived-then-shortest-lived", "chemistry-mix-paint-secondary-color",
    "use-thermometer",
)
SHAPE_TYPES = {"random": SHORT_TASKS, "all": TASK_TYPES, **{name: (name,) for name in TASK_TYPES}}
SPLITS = {"train": "train", "heldout": "test"}  # our split -> the package's variation lists

TOOLS = (Tool("act", "command", "Run one command in the simulator and see what happens.",
              "one ScienceWorld command, for example: open door to kitchen, go to kitchen, look around, "
              "pick up thermometer, focus on red box"),)
QUESTION_TAIL = "\n\nActions: act[<command>], one command per turn."
LOOK = "look around"
MAX_COMMAND = 200  # characters of a command sent to the simulator
INVALID_ACTION_OBSERVATION = "Invalid action: expected act[<command>], for example act[look around] or act[go to kitchen]."
_SYSTEM_HEAD = ("You do science tasks in a simulated house (ScienceWorld). One command per turn. Each turn starts "
                "with your reasoning inside <think></think> (it may be empty), then one action.")
_COMMANDS = ("look around, open door to <room>, go to <room>, pick up <thing>, focus on <thing>, move <thing> to "
             "<place>, use <tool> on <thing>, pour <thing> in <thing>, mix <thing>, wait, or a number to answer a "
             "question the simulator asks")
SYSTEM_TEXT = (_SYSTEM_HEAD + f"\nWrite it on a new line: `Action: act[<command>]`, where the command is one the "
               f"simulator understands: {_COMMANDS}.")
SYSTEM_TOOLS = (_SYSTEM_HEAD + f"\nThe action is one call of the act tool with one command: {_COMMANDS}.")

logger = logging.getLogger(__name__)


def cache_dir() -> Path:
    """Where task records and expert paths are kept: `$RACE_SCIENCEWORLD_CACHE`, else
    `$XDG_CACHE_HOME/race/scienceworld` (`~/.cache/...`), one folder per scienceworld version."""
    root = os.environ.get(CACHE_VARIABLE) or Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") \
        / "race" / "scienceworld"
    return Path(root).expanduser() / f"scienceworld-{version()}"


def _write_whole(path: Path, record: Any) -> None:
    """`record` as JSON at `path`, moved into place whole (a reader never sees half a file)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.NamedTemporaryFile("w", dir=path.parent, prefix=".writing-", suffix=".json", delete=False) as f:
        json.dump(record, f, indent=1)
    os.replace(f.name, path)


def _cached(path: Path, make) -> Any:
    """The JSON at `path`, made by `make()` and written there first when it is not there."""
    if path.exists():
        return json.loads(path.read_text())
    record = make()
    _write_whole(path, record)
    return record


@dataclass(frozen=True)
class ScienceWorldTask:
    task_id: str
    question: str
    task_type: str
    variation: int
    split: str  # the package's: train or test
    task_description: str
    gold: tuple[str, ...]  # the gold path recorded for it (read only by the expert)
    turn_budget: int = TURN_BUDGET

    @property
    def environment(self) -> ScienceWorld:
        return SCIENCEWORLD


def variations() -> dict[str, dict[str, list[int]]]:
    """task type -> {"train": [...], "test": [...]}: the package's variation lists (recorded once)."""
    def make():
        with POOL.borrowed() as simulator:
            return {task_type: simulator.variations(task_type) for task_type in TASK_TYPES}
    return _cached(cache_dir() / "variations.json", make)


def task_record(task_type: str, variation: int) -> dict[str, Any]:
    """The task's description, its first room as the simulator shows it, and a gold path: recorded on
    first use, read from the cache after (the simulator may give another gold path on another load)."""
    def make():
        with POOL.borrowed() as simulator:
            gold = simulator.gold(task_type, variation)
            simulator.load(task_type, variation)
            return {"task_type": task_type, "variation": variation, "task_description": simulator.task_description(),
                    "observation": simulator.look(), "gold": gold}
    return _cached(cache_dir() / "tasks" / f"{task_type}-{variation}.json", make)


def task_of(task_type: str, variation: int, split: str) -> ScienceWorldTask:
    record = task_record(task_type, variation)
    description = record["task_description"].strip()
    question = f"{description}\n\n{record['observation'].strip()}{QUESTION_TAIL}"
    digest = hashlib.sha256(f"{task_type}:{variation}".encode()).hexdigest()[:16]
    return ScienceWorldTask(f"scienceworld-{digest}", question, task_type, variation, split, description,
                            tuple(record["gold"]))


def generate_tasks(n: int, seed: int, difficulty: int | None = None, split: str | None = None,
                   shape: str = "random") -> list[ScienceWorldTask]:
    """`n` distinct (task type, variation) pairs drawn with `random.Random(seed)`: a task type of the shape,
    then one of its variations of the split; deterministic given the arguments. split None: 'heldout'
    for seeds >= HELDOUT_SEED_OFFSET, else 'train'."""
    SCIENCEWORLD.check(shape, difficulty)
    if split is None:
        split = "heldout" if seed >= HELDOUT_SEED_OFFSET else "train"
    if split not in SPLITS:
        raise ValueError(f"split must be 'train' or 'heldout', got {split!r}")
    types = SHAPE_TYPES[shape]
    lists = variations()
    available = sum(len(lists[t][SPLITS[split]]) for t in types)
    if n > available:
        raise ValueError(f"environment 'scienceworld': {n} tasks asked of shape {shape!r}, split {split!r}, which "
                         f"has {available}")
    rng = random.Random(f"scienceworld:{split}:{seed}")
    drawn: set[tuple[str, int]] = set()
    tasks: dict[str, ScienceWorldTask] = {}  # question -> task: two variations opening alike would be one task
    while len(tasks) < n and len(drawn) < available:
        task_type = rng.choice(types)
        variation = rng.choice(lists[task_type][SPLITS[split]])
        if (task_type, variation) not in drawn:
            drawn.add((task_type, variation))
            task = task_of(task_type, variation, SPLITS[split])
            tasks.setdefault(task.question, task)
    if len(tasks) < n:
        raise ValueError(f"environment 'scienceworld': only {len(tasks)} distinct questions of shape {shape!r}, "
                         f"split {split!r}; asked for {n}")
    return list(tasks.values())


def sim_command(text: str) -> str:
    """A command as sent to the simulator: ASCII words, one space apart, at most MAX_COMMAND characters."""
    return " ".join(text.encode("ascii", "ignore").decode().split())[:MAX_COMMAND].strip()


class ScienceWorldEpisode(BudgetEpisode):
    """One task with a budget of turns, on a simulator of the pool: the score decides (100 wins, below 0
    loses); the budget ends it as a failure."""

    tools = TOOLS

    def __init__(self, task: ScienceWorldTask, max_turns: int, pool: SimulatorPool | None = None):
        if max_turns < 1:
            raise ValueError(f"max_turns must be at least 1, got {max_turns}")
        self.pool = pool or POOL
        self.commands: list[str] = []
        self.score = 0
        super().__init__(task, max(max_turns, task.turn_budget))

    def reset(self) -> str:
        self.close()
        self.commands, self.score = [], 0
        return super().reset()

    def act(self, text: str) -> str:
        command = sim_command(bracketed(text, "act") or "")
        if not command:
            return INVALID_ACTION_OBSERVATION
        with self.pool.lock:
            simulator, fresh = self.pool.acquire(self)
            if fresh:
                simulator.load(self.task.task_type, self.task.variation)
                for earlier in self.commands:
                    simulator.step(earlier)
            observation, self.score, completed = simulator.step(command)
        self.commands.append(command)
        if self.score >= 100 or self.score < 0 or completed:
            self.finish(self.score >= 100)
        return observation

    def step(self, action):
        result = super().step(action)
        if result.done:
            self.close()
        return result

    def close(self) -> None:
        self.pool.release(self)


_RULE = re.compile(r"If the .+? temperature is above (?P<threshold>-?\d+(?:\.\d+)?) degrees \w+, place it in the "
                   r"(?P<above>[\w ]+?) box\. If the .+? temperature is below -?\d+(?:\.\d+)? degrees \w+, place it in "
                   r"the (?P<below>[\w ]+?) box")
_MEASURED = re.compile(r"measures a temperature of (?P<value>-?\d+(?:\.\d+)?) degrees")
_TO_BOX = re.compile(r"^(?P<head>move .+ to )(?P<box>[\w ]+?) box$")


def filed(command: str, seen: str, task_description: str) -> tuple[str, str]:
    """`command` with its box chosen by the reading in `seen` where the task files a thing by its
    temperature (use-thermometer: "above 50.0 ..., the green box; below ..., the blue box"), and the reading
    with what it decides ("" where nothing is read or decided). The substance's temperature is drawn again
    at each load, so a recorded gold path's box is right only for the load it was recorded on."""
    rule, measured, move = _RULE.search(task_description), _MEASURED.search(seen), _TO_BOX.match(command)
    if not (rule and measured and move):
        return command, ""
    value, threshold = float(measured["value"]), float(rule["threshold"])
    if value == threshold:
        return command, ""
    side, box = ("above", rule["above"]) if value > threshold else ("below", rule["below"])
    return f"{move['head']}{box} box", f"{measured[0].removeprefix('measures ')}, {side} {rule['threshold']}: the {box} box"


def play(task: ScienceWorldTask, commands: Sequence[str]) -> tuple[bool, list[str]]:
    """Whether `commands` win `task` from its start, and their observations (stops at the end); a box a
    thing is filed in by its temperature is chosen by the reading taken (`filed`)."""
    observations: list[str] = []
    with POOL.borrowed() as simulator:
        simulator.load(task.task_type, task.variation)
        for command in commands:
            command, _ = filed(command, observations[-1] if observations else "", task.task_description)
            observation, score, completed = simulator.step(command)
            observations.append(observation)
            if score >= 100 or score < 0 or completed:
                return score >= 100, observations
    return False, observations


_NAVIGATION = ("go to ", "open door to ", "close door to ")
_NO_OP = ("The door is already open.",)  # observations of a command that changed nothing
_MOVED = re.compile(r"^You move to the ([a-z ]+?)\.")


def _without_round_trips(commands: Sequence[str], observations: Sequence[str], start_room: str) -> list[str]:
    """`commands` without stretches of navigation that leave a room and come back to it (the gold path's
    detours, a door opened and not gone through), but for the doors they opened from that room that a
    later command goes through (a stretch that opened such a door elsewhere is kept, or a shorter one cut)."""
    rooms = [start_room]  # rooms[p + 1]: where the agent is after command p
    for observation in observations:
        moved = _MOVED.match(observation)
        rooms.append(moved[1] if moved else rooms[-1])

    def doors_kept(i: int, j: int) -> list[str] | None:
        """The `open door` commands of commands[i:j] that the rest needs (None: one was opened elsewhere)."""
        kept = []
        for p in range(i, j):
            if not commands[p].startswith("open door to "):
                continue
            room = commands[p][len("open door to "):]
            later = [c for c in commands[j:] if c in (f"go to {room}", f"open door to {room}")]
            if later and later[0] == f"go to {room}":
                if rooms[p] != rooms[i]:
                    return None
                kept.append(commands[p])
        return kept

    out: list[str] = []
    i = 0  # commands[:i] are decided; the agent is in rooms[i]
    while i < len(commands):
        for j in range(len(commands), i, -1):
            if rooms[j] == rooms[i] and all(c.startswith(_NAVIGATION) for c in commands[i:j]) \
                    and (kept := doors_kept(i, j)) is not None:
                out += kept
                i = j
                break
        else:
            out.append(commands[i])
            i += 1
    return out


def _clean_path(task: ScienceWorldTask) -> list[str]:
    """The gold path cut at its win, without the commands that changed nothing (a door already open) and
    without its detours (`_without_round_trips`; the path as it was where the shorter one does not win); then a `look around` after entering a room where the path
    acts before looking (where the path still wins with it). Every other command of the gold path is kept:
    a step whose removal still wins may be the one that shows the agent what to do (a circuit's bulb)."""
    won, observations = play(task, list(task.gold))
    if not won:
        raise RuntimeError(f"the gold path of {task.task_type} variation {task.variation} does not win it")
    commands = list(task.gold[:len(observations)])
    kept = [(c, o) for c, o in zip(commands, observations, strict=True) if o.strip() not in _NO_OP]
    start = _ROOM.findall(task.question)
    trial = _without_round_trips([c for c, _ in kept], [o for _, o in kept], start[0] if start else "")
    if play(task, trial)[0]:
        commands = trial
    looked: list[str] = []
    for j, command in enumerate(commands):
        looked.append(command)
        after = commands[j + 1] if j + 1 < len(commands) else None
        if command.startswith("go to ") and after is not None and after != LOOK and not after.startswith(_NAVIGATION):
            looked.append(LOOK)
    if looked != commands and play(task, looked)[0]:
        commands = looked
    return commands


def expert_commands(task: ScienceWorldTask) -> list[str]:
    """The expert's commands for `task` (`_clean_path`), recorded once per task and `EXPERT_VERSION`."""
    path = cache_dir() / "expert" / f"{task.task_type}-{task.variation}-e{EXPERT_VERSION}.json"
    return _cached(path, lambda: {"commands": _clean_path(task)})["commands"]


# The expert's texts. A kind is read back from the text alone (`reasoning_kind`), as for the lookup world.
_SEEN_NOTE = ("Noted for later: {things} {verb} here, in the {room}.", "I keep in mind that {things} {verb} in the {room}.")
_READING = ("The reading: {reading}.", "I read the result: {reading}.")
_OPEN_DOOR = ("The door to the {place} is closed; I open it.", "I open the door to the {place}.")
_GO = ("I go to the {place}.", "Next I head to the {place}.")
_LOOK = ("I look around to see what is here.", "I look around the room.")
_PICK = ("I pick up the {thing}.", "I take the {thing} with me.")
_FOCUS = ("The task asks me to focus on it: I focus on the {thing}.", "I focus on the {thing}, as the task says.")
_OTHER = ("Next: {command}.", "Now: {command}.")
_DONE = ("That should complete the task: {goal}.", "With this the task is done: {goal}.")

_LATER_RE = template_pattern(_SEEN_NOTE)
_CURRENT_RE = template_pattern(_READING + _OPEN_DOOR + _GO + _LOOK + _PICK + _FOCUS + _OTHER)

_READING_TEXT = re.compile(r"(?:the \w+ measures a temperature of -?\d+(?:\.\d+)? degrees \w+"
                           r"|the \w+ (?:turns|is) (?:on|off|activated|deactivated)[^.\n]*)", re.I)
_ROOM = re.compile(r"(?:This (?:room|outside location) is called the|You move to the) ([a-z ]+?)\.")
_TWO_OBJECTS = re.compile(r"^(?:move|pour|use|put|connect|dunk) (?P<a>.+) (?:to|in|into|on) (?P<b>.+)$")
_ONE_OBJECT = re.compile(r"^(?:pick up|focus on|look at|look in|read|mix|activate|deactivate|open|close|eat|drink"
                         r"|examine) (?P<a>.+)$")
_ROOM_WORDS = frozenset("hallway art studio bedroom greenhouse kitchen living room workshop bathroom foundry "
                        "outside".split())
_FILLER = frozenset({"in", "on", "to", "into", "the", "a", "an", "inventory", "of"}) | _ROOM_WORDS
_WORDS = re.compile(r"[a-z0-9]+")


def objects_of(command: str) -> list[str]:
    """The objects a command names (what an agent must have seen to write it); no doors or rooms."""
    if command.startswith(_NAVIGATION) or command == LOOK:
        return []
    match = _TWO_OBJECTS.match(command) or _ONE_OBJECT.match(command)
    if match is None:
        return []
    return [value for value in match.groupdict().values() if value and _words(value)]


def _words(name: str) -> frozenset[str]:
    return frozenset(_WORDS.findall(name.lower())) - _FILLER


_FRAGMENTS = re.compile(r"[.:]\s+|,\s+(?![^()]*\))")  # "a table. On the table is: a bowl (containing x, y)"


def _shown(text: str, name: str) -> str | None:
    """What in `text` shows the object `name` (every word of its name in one item of a line), as "bowl
    (containing nothing)"; or None."""
    words = _words(name)
    if not words:
        return None
    for line in text.splitlines():
        if words <= frozenset(_WORDS.findall(line.lower())):
            items = [f for f in _FRAGMENTS.split(line.strip().rstrip(".")) if words <= frozenset(_WORDS.findall(f.lower()))]
            return re.sub(r"^(?:an?|the)\s+", "", (items[0] if items else line).strip())
    return None


def _listed(things: Sequence[str]) -> str:
    names = [f"the {t}" for t in things]
    return names[0] if len(names) == 1 else ", ".join(names[:-1]) + f" and {names[-1]}"


def _goal(task_description: str) -> str:
    """The task's first sentence, as "find a(n) living thing"."""
    text = re.sub(r"^Task Description:\s*", "", task_description.strip())
    first = re.split(r"(?<=\.)\s", text, maxsplit=1)[0].rstrip(".")
    return re.sub(r"^Your task is to\s+", "", first)


def reasoning_kind(reasoning: str) -> str:
    """The kind of a reasoning text written the expert's way: where needed things are, kept for later; the
    step at hand or a reading; anything else `redundant`; no text `empty`."""
    if not reasoning:
        return EMPTY
    if _LATER_RE.match(reasoning):
        return LATER
    return CURRENT if _CURRENT_RE.match(reasoning) else REDUNDANT


class ScienceWorldExpert:
    """A `run_episode` policy for one task: plays `commands` and writes reasoning from the question and the
    observations it has seen; `observations` (those of the same commands, replayed) tell it which things
    the agent will see again before it needs them. `kinds[t]` is turn t's kind. `for_task` builds one."""

    def __init__(self, commands: Sequence[str], observations: Sequence[str], task_description: str,
                 rng: random.Random, empty_reasoning_share: float = DEFAULT_EMPTY_REASONING_SHARE):
        if not 0.0 <= empty_reasoning_share <= 1.0:
            raise ValueError(f"empty_reasoning_share must be in [0, 1], got {empty_reasoning_share}")
        self.commands = list(commands)
        self.observations = list(observations)
        self.task_description = task_description
        self.goal = _goal(task_description)
        self.rng = rng
        self.empty_reasoning_share = empty_reasoning_share
        self.kinds: list[str] = []
        self.noted: set[frozenset[str]] = set()
        self.carried: set[frozenset[str]] = set()

    @classmethod
    def for_task(cls, task: ScienceWorldTask, rng: random.Random,
                 empty_reasoning_share: float = DEFAULT_EMPTY_REASONING_SHARE) -> ScienceWorldExpert:
        commands = expert_commands(task)
        _, observations = play(task, commands)
        return cls(commands, observations, task.task_description, rng, empty_reasoning_share)

    def _to_note(self, k: int, seen: str) -> list[str]:
        """What turn k notes for later: things shown by what it has just seen (the first room, a look around),
        named by a later command and not by this one, not carried, and shown by no observation between now
        and that command."""
        if not (k == 0 or self.commands[k - 1] == LOOK):
            return []
        now = {_words(name) for name in objects_of(self.commands[k])}
        notes: dict[frozenset[str], str] = {}
        rule = _RULE.search(self.task_description)
        for u in range(k + 1, len(self.commands)):
            names = objects_of(self.commands[u])
            if rule and _TO_BOX.match(self.commands[u]):  # which box the reading will decide: either may be needed
                names = [*names[:-1], f"{rule['above']} box", f"{rule['below']} box"]
            for name in names:
                words = _words(name)
                if words in now or words in self.noted or words in self.carried or words in notes:
                    continue
                line = _shown(seen, name)
                if line and not any(_shown(text, name) for text in self.observations[k:u]):
                    notes[words] = line
        self.noted.update(notes)
        return list(notes.values())

    def _step_note(self, command: str) -> tuple[str, str]:
        pick = self.rng.choice
        for prefix, texts, key in (("open door to ", _OPEN_DOOR, "place"), ("go to ", _GO, "place"),
                                   ("pick up ", _PICK, "thing"), ("focus on ", _FOCUS, "thing")):
            if command.startswith(prefix):
                thing = command[len(prefix):]
                if prefix == "pick up ":
                    self.carried.add(_words(thing))
                return pick(texts).format(**{key: thing}), CURRENT
        if command == LOOK:
            return pick(_LOOK), CURRENT
        return pick(_OTHER).format(command=command), CURRENT

    def __call__(self, question: str, turns: Sequence[Turn]) -> tuple[str, str]:
        k = len(turns)
        if k >= len(self.commands):
            raise RuntimeError(f"the expert's {len(self.commands)} commands did not end the task")
        seen = question[len(self.task_description):] if k == 0 else turns[-1].observation  # not the task's own text
        command, decided = filed(self.commands[k], seen, self.task_description)
        self.commands[k] = command  # the box the reading decides, not the recorded gold path's
        room = _ROOM.findall(seen)
        if noted := self._to_note(k, seen):
            reasoning = self.rng.choice(_SEEN_NOTE).format(things=_listed(noted), verb="is" if len(noted) == 1 else "are",
                                                           room=room[-1] if room else "room")
            kind = LATER
            if command.startswith("pick up "):
                self.carried.add(_words(command[len("pick up "):]))
        elif decided or (reading := _READING_TEXT.search(seen)):
            reasoning, kind = self.rng.choice(_READING).format(reading=decided or reading[0]), CURRENT
        elif k == len(self.commands) - 1 and k > 0:
            reasoning, kind = self.rng.choice(_DONE).format(goal=self.goal), REDUNDANT
            if self.rng.random() < self.empty_reasoning_share:
                reasoning, kind = "", EMPTY
        else:
            reasoning, kind = self._step_note(command)
        self.kinds.append(kind)
        return reasoning, f"act[{command}]"


class ScienceWorld(Environment):
    """ScienceWorld as an `Environment` (module docstring)."""

    name = "scienceworld"
    environment = ENVIRONMENT_NAME
    revision = ENV_REVISION
    shapes = tuple(SHAPE_TYPES)
    tools = TOOLS
    system_text = SYSTEM_TEXT
    system_tools = SYSTEM_TOOLS
    libraries = ("scienceworld",)  # its worlds are the package's: the stages that play them key on its version

    def generate_tasks(self, n: int, seed: int, difficulty: int | None = None, split: str | None = None,
                       shape: str = "random") -> list[ScienceWorldTask]:
        return generate_tasks(n, seed, difficulty, split, shape)

    def episode(self, task: ScienceWorldTask, max_turns: int) -> ScienceWorldEpisode:
        return ScienceWorldEpisode(task, max_turns)

    def task_group(self, task: ScienceWorldTask) -> str:
        """What a report breaks results down by (`race bench sampling`): the task type."""
        return task.task_type

    def expert_dataset(self, n: int, seed: int, difficulty: int | None = None,
                       empty_reasoning_share: float = DEFAULT_EMPTY_REASONING_SHARE,
                       source_revision: str = EXPERT_SOURCE_REVISION, reasoning_kinds: bool = False,
                       shape: str = "random") -> list[Trajectory]:
        rng = random.Random(f"scienceworld-expert:{seed}")
        out = []
        started = last = time.monotonic()
        tasks = generate_tasks(n, seed, difficulty, shape=shape)
        for k, task in enumerate(tasks):
            if time.monotonic() - last >= PROGRESS_INTERVAL_S:  # a task not yet recorded takes seconds of simulator
                last = time.monotonic()
                logger.info(f"scienceworld expert: {k} of {len(tasks)} tasks played, {len(out)} won "
                            f"({last - started:.0f} s)")
            policy = ScienceWorldExpert.for_task(task, rng, empty_reasoning_share)
            episode = self.run_episode(task, policy, task.turn_budget)  # a path longer than the budget loses
            if episode.success:
                trajectory = episode.to_trajectory(source_revision=source_revision)
                if reasoning_kinds:
                    trajectory = replace(trajectory, extra={**trajectory.extra, "reasoning_kinds": policy.kinds})
                out.append(trajectory)
        return out

    def reasoning_kind(self, reasoning: str) -> str:
        return reasoning_kind(reasoning)


SCIENCEWORLD = ScienceWorld()
