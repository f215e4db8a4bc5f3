"""Synthetic workloads, built from words the tokenizer encodes as one token each, so every field has
an exact token length; and the checkpoints they run on.

- `Workload` (`race bench scoring`, the default): N trajectories of T turns, every field the same length.
- `LongWorkload` (`--workload long`): episodes of the shapes real agents write (SWE-agent, ALFWorld
  and web agents run 10-50 turns): each trajectory draws its turn count, and each turn its
  observation, reasoning and action lengths, from ranges (reasoning may be empty: a turn that only
  acts is no candidate); turns stop where the rendering would pass the model's context.
"""

from __future__ import annotations

import random
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from race_core.render import OBSERVATION_PREFIX, Renderer
from race_core.schema import Trajectory, Turn

MODELS = ("tiny", "20m")


@dataclass(frozen=True)
class Workload:
    """N trajectories x T turns; every field has exactly this many tokens."""

    n: int = 64
    turns: int = 8
    question_tokens: int = 24
    reasoning_tokens: int = 40
    action_tokens: int = 10
    observation_tokens: int = 20
    seed: int = 0


@dataclass(frozen=True)
class LongWorkload:
    """N episodes; each draws its turns, and each turn its field lengths, uniformly from these inclusive ranges."""

    n: int = 16
    turns: tuple[int, int] = (5, 40)
    observation_tokens: tuple[int, int] = (20, 400)
    reasoning_tokens: tuple[int, int] = (0, 150)
    action_tokens: tuple[int, int] = (5, 30)
    question_tokens: int = 48
    max_tokens: int = 0  # the rendering's cap (0: the model's context, given to `long_trajectories`)
    seed: int = 0


def checkpoint_for(model: str, cache_dir: str) -> Path:
    """The local checkpoint of a `race_core.tiny` preset (built on first use)."""
    from race_core.tiny import PRESETS, ensure_checkpoint

    return ensure_checkpoint(cache_dir, PRESETS[model])


def single_token_words(renderer: Renderer) -> list[str]:
    """Alphabetic vocabulary entries with a leading space that encode to exactly one token: any
    concatenation of them encodes to one token per word (the pre-tokenizer splits at the spaces)."""
    vocab = renderer.tokenizer.get_vocab()
    words = sorted({renderer.tokenizer.convert_tokens_to_string([tok]) for tok in vocab})
    words = [w for w in words if len(w) > 1 and w[0] == " " and w[1:].isalpha()
             and len(renderer.encode(w)) == 1]
    if len(words) < 8:
        raise ValueError(f"the tokenizer has only {len(words)} single-token words; need at least 8")
    return words


def iter_synthetic(renderer: Renderer, workload: Workload) -> Iterator[Trajectory]:
    """Deterministic trajectories of the workload's shape, one at a time (for streaming)."""
    words = single_token_words(renderer)
    rng = random.Random(f"bench-scoring:{workload.seed}")

    def text(tokens: int, prefix: str = "") -> str:
        out = "".join(rng.choice(words) for _ in range(tokens))
        got = len(renderer.encode(prefix + out)) - len(renderer.encode(prefix))
        if got != tokens:
            raise AssertionError(f"synthetic text has {got} tokens, expected {tokens}")
        return out

    for i in range(workload.n):
        turns = tuple(Turn(reasoning=text(workload.reasoning_tokens), action=text(workload.action_tokens),
                           observation=text(workload.observation_tokens, OBSERVATION_PREFIX))
                      for _ in range(workload.turns))
        yield Trajectory(question=f"Task{i}:" + text(workload.question_tokens), environment="bench",
                         source_revision="bench-scoring", turns=turns)


def synthetic_trajectories(renderer: Renderer, workload: Workload) -> list[Trajectory]:
    return list(iter_synthetic(renderer, workload))


def long_trajectories(renderer: Renderer, workload: LongWorkload, context: int) -> list[Trajectory]:
    """The long workload's episodes (deterministic from its seed). An episode is cut to the turns whose
    rendering fits `workload.max_tokens` or else `context` (the model's); one that cannot keep two
    turns is an error naming the cap (a workload too long for the model)."""
    words = single_token_words(renderer)
    rng = random.Random(f"bench-scoring-long:{workload.seed}")
    cap = workload.max_tokens or context

    def text(tokens: int) -> str:
        return "".join(rng.choice(words) for _ in range(tokens))

    out = []
    for i in range(workload.n):
        turns = [Turn(reasoning=text(rng.randint(*workload.reasoning_tokens)),
                      action=text(rng.randint(*workload.action_tokens)),
                      observation=text(rng.randint(*workload.observation_tokens)))
                 for _ in range(rng.randint(*workload.turns))]
        question = f"Task{i}:" + text(workload.question_tokens)
        while True:
            trajectory = Trajectory(question=question, environment="bench", source_revision="bench-scoring-long",
                                    turns=tuple(turns))
            if len(renderer.render(trajectory)) <= cap:
                break
            if len(turns) <= 2:
                raise ValueError(f"long workload: episode {i} does not fit {cap} tokens in two turns; "
                                 "lower the field lengths or raise --max-tokens")
            turns.pop()
        out.append(trajectory)
    return out
