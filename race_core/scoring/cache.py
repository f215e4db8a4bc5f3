"""Scores shared by content: each distinct request is scored once (the ε sweep of `race cover`).

Which reasoning the cover removes depends on ε; most of the likelihoods it asks for do not. The
baseline of every trajectory, every first-round candidate, and every later candidate whose earlier
decisions agree are the same requests under every ε. `CachingScorer` keys a request by exactly what
the model computes for it: the rendered token ids and the token spans of the actions it scores (a
scorer without a renderer: the trajectory's canonical JSON and the turns scored). A request already
in the shared `ScoreMemory` is answered from it, so one cover run per ε redoes none of the work of
the runs before it.

A remembered score is the one computed in the batch of the run that first asked for it; a fresh run
could batch it differently, which moves it by the scorer's batching noise. The cover stage checks
that this noise is far below ε (`race_core.cover.check_noise`), so the decisions are the same.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass, field
from typing import TypeVar

from race_core.scoring import Scorer, ScoreRequest, ScorerStats

T = TypeVar("T")


@dataclass
class ScoreMemory:
    """Scores by request content, shared by every `CachingScorer` built on it, and what was asked
    (what the same cover runs without sharing would have scored) against what was computed."""

    scores: dict[str, list[float]] = field(default_factory=dict)
    noise: dict[tuple[str, ...], tuple[float, int]] = field(default_factory=dict)  # value, requests it took
    requests_asked: int = 0  # scoring requests; a noise measurement counts the requests it took
    requests_computed: int = 0  # requests the wrapped scorer scored
    actions_asked: int = 0  # action likelihoods asked for by `score` (one per turn scored)
    actions_computed: int = 0

    def counts(self) -> dict[str, int]:
        return {name: getattr(self, name) for name in
                ("requests_asked", "requests_computed", "actions_asked", "actions_computed")}


class CachingScorer:
    """A Scorer answering from `memory` what it already holds and passing the rest to `inner`.

    `stats` counts the requests this scorer answered and what it made `inner` do (every work
    counter but `requests`: forwards, rows, tokens, ...), so a cover stage reports its own work. The memory and `inner` belong to the caller,
    who shares them across cover runs and closes `inner` when done: `close` here frees nothing."""

    def __init__(self, inner: Scorer, memory: ScoreMemory):
        self.inner = inner
        self.memory = memory
        self.name = inner.name
        self.renderer = inner.renderer
        self.max_length = inner.max_length
        self.stats = ScorerStats()

    def request_key(self, request: ScoreRequest) -> str:
        """What the model computes for `request`, as a digest: the ids it is fed and the spans it averages."""
        if self.renderer is not None:
            rendered = self.renderer.render(request.trajectory)
            spans = rendered.action_spans[request.from_turn: request.last_turn + 1]
            content = rendered.input_ids.tobytes() + json.dumps([[int(a), int(b)] for a, b in spans]).encode()
        else:
            content = json.dumps([request.trajectory.to_dict(), request.from_turn, request.last_turn],
                                 sort_keys=True).encode()
        return hashlib.sha256(content).hexdigest()

    def score(self, requests: Sequence[ScoreRequest]) -> list[list[float]]:
        memory = self.memory
        keys = [self.request_key(r) for r in requests]
        missing: dict[str, ScoreRequest] = {}
        for key, request in zip(keys, requests, strict=True):
            if key not in memory.scores:
                missing.setdefault(key, request)
        if missing:
            computed = self._counted(lambda: self.inner.score(list(missing.values())))
            memory.scores.update(zip(missing, computed, strict=True))
            memory.actions_computed += sum(len(s) for s in computed)
        answers = [list(memory.scores[key]) for key in keys]
        memory.requests_asked += len(requests)
        memory.actions_asked += sum(len(s) for s in answers)
        self.stats.requests += len(requests)
        return answers

    def release(self, keys: Sequence[Hashable] | None = None) -> None:
        self.inner.release(keys)

    def measure_noise(self, requests: Sequence[ScoreRequest]) -> float:
        """The wrapped scorer's batching noise on these requests, measured once per distinct set."""
        key = tuple(self.request_key(r) for r in requests)
        if key not in self.memory.noise:
            taken = self.memory.requests_computed
            noise = self._counted(lambda: self.inner.measure_noise(requests))
            self.memory.noise[key] = (noise, self.memory.requests_computed - taken)
        noise, cost = self.memory.noise[key]
        self.memory.requests_asked += cost
        return noise

    def close(self) -> None:
        return None

    def _counted(self, call: Callable[[], T]) -> T:
        """Run `call` on the wrapped scorer; add what it did to `stats` and the memory's computed requests."""
        before = self.inner.stats.work()
        result = call()
        done = self.inner.stats.work() - before
        self.memory.requests_computed += done.requests
        done.requests = 0  # `stats.requests` counts the requests this view answered
        for name, value in done.counts().items():
            setattr(self.stats, name, getattr(self.stats, name) + value)
        return result
