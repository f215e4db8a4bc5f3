"""Likelihood scoring of actions: ℓ(a_j | h_j) = mean log-probability of turn j's action tokens.

A Scorer answers a batch of requests, each "score the actions of turns `from_turn`..`to_turn` of
this trajectory". `key` names the trajectory a request continues, so a scorer may keep the KV of the
part that did not change (the ids before turn `from_turn`) and reuse it for the next request with
the same key; it checks the ids match before reusing anything.
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

from race_core.schema import Trajectory


@dataclass(frozen=True)
class ScoreRequest:
    key: Hashable
    trajectory: Trajectory
    from_turn: int = 0
    to_turn: int | None = None  # inclusive; None = the last turn

    @property
    def last_turn(self) -> int:
        return len(self.trajectory.turns) - 1 if self.to_turn is None else self.to_turn


@runtime_checkable
class Scorer(Protocol):
    name: str

    def score(self, requests: Sequence[ScoreRequest]) -> list[list[float]]:
        """For each request, the action mean log-probs of turns from_turn..last_turn, in order."""
        ...

    def release(self, keys: Sequence[Hashable] | None = None) -> None:
        """Forget any state kept for these keys (all keys when None)."""
        ...


def make_scorer(backend: str, checkpoint: str, **options) -> Scorer:
    """Build a scorer by backend name ('hf' or 'vllm') over a local checkpoint folder."""
    if backend == "hf":
        from race_core.scoring.hf import HFScorer

        return HFScorer.from_pretrained(checkpoint, **options)
    if backend == "vllm":
        from race_core.scoring.vllm import VLLMScorer

        return VLLMScorer.from_pretrained(checkpoint, **options)
    raise ValueError(f"unknown scoring backend {backend!r}: expected 'hf' or 'vllm'")
