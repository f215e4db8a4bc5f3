"""Likelihood scoring of actions: ℓ(a_j | h_j) = mean log-probability of turn j's action tokens.

A Scorer answers a batch of requests, each "score the actions of turns `from_turn`..`to_turn` of
this trajectory". `key` names the trajectory a request continues, so a scorer may keep the KV of the
part that did not change (the ids before turn `from_turn`) and reuse it for the next request with
the same key; it checks the ids match before reusing anything.

This module is the one home of what every backend shares: the request, the `Scorer` protocol (all
a caller may use, so it needs no `hasattr`), the `ScorerStats` counters and the batching-noise
measure (`batch_noise`).
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Protocol, runtime_checkable

from race_core.schema import Trajectory

if TYPE_CHECKING:
    from race_core.render import Renderer


@dataclass(frozen=True)
class ScoreRequest:
    key: Hashable
    trajectory: Trajectory
    from_turn: int = 0
    to_turn: int | None = None  # inclusive; None = the last turn

    @property
    def last_turn(self) -> int:
        return len(self.trajectory.turns) - 1 if self.to_turn is None else self.to_turn


@dataclass
class ScorerStats:
    """What a scorer did, counted over its lifetime."""

    forward_calls: int = 0  # model forwards (hf) or engine calls (vllm)
    requests: int = 0
    tokens_processed: int = 0  # tokens fed through the model (padding excluded)
    tokens_reused: int = 0  # tokens whose keys/values came from the prefix cache
    kv_bytes_peak: int = 0  # most bytes of kept KV-prefix copies held at once (hf: within its KV budget)
    evictions: int = 0  # KV-prefix copies dropped (or not kept) to stay within the KV budget
    extra: dict = field(default_factory=dict)


@runtime_checkable
class Scorer(Protocol):
    name: str
    renderer: Renderer | None  # renders the trajectories it scores; None for a plain callable
    stats: ScorerStats
    max_length: int | None  # the longest sequence the model scores (its context); None: no limit known

    def score(self, requests: Sequence[ScoreRequest]) -> list[list[float]]:
        """For each request, the action mean log-probs of turns from_turn..last_turn, in order."""
        ...

    def release(self, keys: Sequence[Hashable] | None = None) -> None:
        """Forget any state kept for these keys (all keys when None)."""
        ...

    def measure_noise(self, requests: Sequence[ScoreRequest]) -> float:
        """Max |difference| between scoring each request alone and all of them at once."""
        ...

    def close(self) -> None:
        """Free what the scorer holds (an engine it built, its caches); it is not used after."""
        ...


def batch_noise(scorer: Scorer, requests: Sequence[ScoreRequest]) -> float:
    """Max |difference| between scoring each request alone (one `score` call each) and all of them
    in one call: the float noise batching adds, to compare with ε."""
    alone = [scorer.score([r])[0] for r in requests]
    batched = scorer.score(list(requests))
    return max((abs(a - b) for xs, ys in zip(alone, batched, strict=True) for a, b in zip(xs, ys, strict=True)),
               default=0.0)


def make_scorer(backend: str, checkpoint: str, **options) -> Scorer:
    """Build a scorer by backend name ('hf' or 'vllm') over a local checkpoint folder."""
    if backend == "hf":
        from race_core.scoring.hf import HFScorer

        return HFScorer.from_pretrained(checkpoint, **options)
    if backend == "vllm":
        from race_core.scoring.vllm import VLLMScorer

        return VLLMScorer.from_pretrained(checkpoint, **options)
    raise ValueError(f"unknown scoring backend {backend!r}: expected 'hf' or 'vllm'")
