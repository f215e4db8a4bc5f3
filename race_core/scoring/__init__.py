"""Likelihood scoring of actions: ℓ(a_j | h_j) = mean log-probability of turn j's action tokens.

A Scorer answers a batch of requests, each "score the actions of turns `from_turn`..`to_turn` of
this trajectory". `key` names the trajectory a request continues, so a scorer may keep the KV of the
part that did not change (the ids before turn `from_turn`) and reuse it for the next request with
the same key; it checks the ids match before reusing anything.

This module is the one home of what every backend shares: the request, the `Scorer` protocol (all
a caller may use, so it needs no `hasattr`), the `WorkCounters` a scorer keeps (in its `ScorerStats`)
and the batching-noise measure (`batch_noise`).

The work counters count what the scorer did, not how long it took: the same requests in the same
order on the same model give the same counts on any machine, so a test can pin them (a batching or
caching regression changes them) and a benchmark can put them beside its timings.
"""

from __future__ import annotations

from collections.abc import Hashable, Iterable, Sequence
from dataclasses import dataclass, field, fields
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

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
class WorkCounters:
    """What a scorer did, in counts that depend on the requests, the model's shape and the scorer's
    settings alone (never on the machine's speed). A backend counts what it can see; the rest stay 0
    (vLLM sees engine calls, requests and prompt tokens)."""

    forward_calls: int = 0  # batched forwards (hf: one per batch, however many chunks) or engine calls (vllm)
    decoder_calls: int = 0  # calls of the model itself (hf: a batch fed in chunks makes one per chunk)
    requests: int = 0
    rows: int = 0  # sequences in the forwards (a request is one row)
    tokens_processed: int = 0  # tokens fed through the model (padding excluded)
    padded_positions: int = 0  # positions the forwards computed: rows x each batch's longest fed length
    tokens_reused: int = 0  # tokens whose keys/values came from the prefix cache
    attention_pairs: int = 0  # (query, key) pairs one attention layer computes, padding and masked ones included
    mask_bytes: int = 0  # bytes of the attention masks the forwards built (rows x queries x keys, one byte each)
    kv_bytes_copied: int = 0  # bytes of cached keys/values copied (into a batch's cache, out into kept copies)
    evictions: int = 0  # KV-prefix copies dropped (or not kept) to stay within the KV budget

    def __add__(self, other: WorkCounters) -> WorkCounters:
        return WorkCounters(**{f.name: getattr(self, f.name) + getattr(other, f.name) for f in fields(WorkCounters)})

    def __sub__(self, other: WorkCounters) -> WorkCounters:
        return WorkCounters(**{f.name: getattr(self, f.name) - getattr(other, f.name) for f in fields(WorkCounters)})

    def counts(self) -> dict[str, int]:
        """The counters as a JSON-ready dict (a manifest's or a benchmark record's `work`)."""
        return {f.name: getattr(self, f.name) for f in fields(WorkCounters)}

    @classmethod
    def total(cls, counts: Iterable[dict[str, Any] | None]) -> WorkCounters:
        """The sum of `counts()` dicts (a missing one or a missing name counts 0; unknown names are ignored)."""
        names = {f.name for f in fields(cls)}
        out = cls()
        for entry in counts:
            for name, value in (entry or {}).items():
                if name in names:
                    setattr(out, name, getattr(out, name) + int(value))
        return out


@dataclass
class ScorerStats(WorkCounters):
    """What a scorer did over its lifetime: the work counters, the most KV bytes it held at once and
    backend facts (`extra`)."""

    kv_bytes_peak: int = 0  # most bytes of kept KV-prefix copies held at once (hf: within its KV budget)
    extra: dict = field(default_factory=dict)

    def work(self) -> WorkCounters:
        """A snapshot of the work counters (subtract two to get what happened in between)."""
        return WorkCounters(**{f.name: getattr(self, f.name) for f in fields(WorkCounters)})


def sum_work(records: Iterable[dict[str, Any] | None]) -> dict[str, Any]:
    """The sum of work records (`WorkCounters.counts()` with the work bound's `bound_tokens`, as a
    cover shard records them); empty ones (nothing scored) are skipped. `bound_tokens` is None
    unless every record has it."""
    records = [r for r in records if r]
    bounds = [r.get("bound_tokens") for r in records]
    return {**WorkCounters.total(records).counts(),
            "bound_tokens": sum(bounds) if bounds and None not in bounds else None}


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
