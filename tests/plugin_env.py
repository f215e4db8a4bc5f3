"""An environment written outside race_core, as a user's would be: `--env plugin_env:GUESS` (this
folder on the path), or installed under the entry point group `race.environments`. It wraps a
Gymnasium-style text game (`reset() -> observation`, `step(action) -> (observation, reward,
terminated, truncated, info)`): docs/guides/environments.md shows the same adapter.

The game: find a secret integer between 1 and 2**k; each guess is answered "higher" or "lower". The
expert halves the range; its reasoning notes the range a later guess needs (`later`), says which
guess it makes now (`current`), or restates the last answer (`redundant`)."""

from __future__ import annotations

import hashlib
import random
from dataclasses import dataclass, replace

from race_core.envs.base import (
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


class GuessGame:
    """The game as its authors wrote it, knowing nothing of race (Gymnasium's step signature)."""

    def __init__(self, secret: int, high: int):
        self.secret, self.high = secret, high

    def reset(self) -> str:
        return f"I picked an integer from 1 to {self.high}. Find it."

    def step(self, action: str):
        try:
            guess = int(action)
        except ValueError:
            return "Not a number.", 0.0, False, False, {}
        if guess == self.secret:
            return "Correct!", 1.0, True, False, {}
        return ("higher" if guess < self.secret else "lower"), 0.0, False, False, {}


GUESS_TOOL = Tool("guess", "number", "Guess the secret integer.", "an integer")


@dataclass(frozen=True)
class GuessTask:
    task_id: str
    question: str
    secret: int
    high: int

    @property
    def environment(self) -> Guess:
        return GUESS


class GuessEpisode(BudgetEpisode):
    """race's episode over one game: the text action `guess[N]` is the game's action N."""

    tools = (GUESS_TOOL,)

    def reset(self) -> str:
        self.game = GuessGame(self.task.secret, self.task.high)
        self.game.reset()
        return super().reset()

    def act(self, text: str) -> str:
        value = bracketed(text, "guess")
        if value is None:
            return "Invalid action: write guess[N]."
        observation, reward, terminated, _, _ = self.game.step(value.strip())
        return self.finish(reward > 0) if terminated else observation


class Guess(Environment):
    name = "guess"
    environment = "guess-number-v1"
    revision = "1"
    difficulties = (2, 3, 4)  # k: the secret is at most 2**k
    tools = (GUESS_TOOL,)
    system_text = ("Find a secret integer, one guess per turn. Each turn starts with your reasoning inside "
                   "<think></think> (it may be empty), then on a new line `Action: guess[<integer>]`.")
    system_tools = ("Find a secret integer, one guess per turn. Each turn starts with your reasoning inside "
                    "<think></think> (it may be empty), then one call of the guess tool.")

    def generate_tasks(self, n, seed, difficulty=None, split=None, shape="random"):
        split = split or ("heldout" if seed >= HELDOUT_SEED_OFFSET else "train")
        rng, tasks, seen = random.Random(f"guess:{seed}"), [], set()
        while len(tasks) < n:
            k = difficulty or rng.choice(self.difficulties)
            secret = rng.randint(1, 2 ** k)
            question = f"I picked an integer from 1 to {2 ** k}. Find it. (game {rng.randrange(10 ** 6)})"
            held_out = int(hashlib.sha256(question.encode()).hexdigest(), 16) % 5 == 0
            if question not in seen and held_out == (split == "heldout"):
                seen.add(question)
                tasks.append(GuessTask(f"guess-{seed}-{len(tasks)}", question, secret, 2 ** k))
        return tasks

    def episode(self, task, max_turns):
        return GuessEpisode(task, max_turns)

    def expert_dataset(self, n, seed, difficulty=None, empty_reasoning_share=0.3,
                       source_revision=EXPERT_SOURCE_REVISION, reasoning_kinds=False, shape="random"):
        rng, out = random.Random(f"guess-expert:{seed}"), []
        for task in self.generate_tasks(n, seed, difficulty, shape=shape):
            expert = GuessExpert(task.high, rng, empty_reasoning_share)
            episode = self.run_episode(task, expert, max_turns=8)
            if episode.success:
                trajectory = episode.to_trajectory(source_revision=source_revision)
                if reasoning_kinds:
                    trajectory = replace(trajectory, extra={**trajectory.extra, "reasoning_kinds": expert.kinds})
                out.append(trajectory)
        return out

    def reasoning_kind(self, reasoning: str) -> str:
        return EMPTY if not reasoning.strip() else REDUNDANT if reasoning.startswith("The last") else LATER


class GuessExpert:
    """Halves the range: (question, turns so far) -> (reasoning, action), each turn's kind in `kinds`."""

    def __init__(self, high: int, rng: random.Random, empty_share: float):
        self.low, self.high, self.rng, self.empty_share, self.kinds = 1, high, rng, empty_share, []

    def __call__(self, question, turns):
        if turns:  # the last answer narrows the range
            last = int(bracketed(turns[-1].action, "guess"))
            self.low, self.high = (last + 1, self.high) if turns[-1].observation == "higher" else (self.low, last - 1)
        action = f"guess[{(self.low + self.high) // 2}]"
        if turns and self.rng.random() < self.empty_share:
            self.kinds.append(EMPTY)
            return "", action
        kind = REDUNDANT if turns and self.rng.random() < 0.3 else LATER
        self.kinds.append(kind)
        if kind == REDUNDANT:
            return f"The last answer was {turns[-1].observation}.", action
        return f"The secret is between {self.low} and {self.high}.", action


GUESS = Guess()


class BrokenGuess(Guess):
    """The game with what a plug-in gets wrong, on purpose (for `race env check`): every task in both
    splits, an expert whose reasoning `reasoning_kind` reads otherwise, and a judge that raises on a
    replay."""

    name = "broken-guess"

    def generate_tasks(self, n, seed, difficulty=None, split=None, shape="random"):
        return super().generate_tasks(n, 0, difficulty, split="train", shape=shape)

    def reasoning_kind(self, reasoning: str) -> str:
        return "current"

    def episode(self, task, max_turns):
        episode = super().episode(task, max_turns)
        if getattr(self, "playing_expert", False):
            return episode
        episode.act = lambda text: 1 / 0
        return episode

    def expert_dataset(self, *args, **kwargs):
        self.playing_expert = True
        try:
            return super().expert_dataset(*args, **kwargs)
        finally:
            self.playing_expert = False


BROKEN = BrokenGuess()
