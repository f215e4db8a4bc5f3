"""LoGiC progressive cover (docs/architecture.md §4; the paper's Algorithm 1), batched as a wavefront.

For each successful trajectory with turns 0..T-1:
  1. s_j = ℓ(a_j | h_j) for every turn j, on the trajectory as it stands.
  2. For t = 1 .. T-1: the candidate is the current trajectory with reasoning_t removed. Score
     ℓ̃_j for j >= t and d_j = s_j - ℓ̃_j. Accept iff d_j <= ε for every j >= t; an accepted
     candidate becomes the current trajectory and s_j <- ℓ̃_j for j >= t, so accepted removals
     shape the context of every later candidate. Turn 0 is never removed; a turn whose reasoning
     is already empty is skipped (logged, not scored).

Candidates of one trajectory are sequential; across trajectories they are independent, so round t
scores candidate t of every trajectory in one batched call. With `early_reject`, a round first
scores only the action right after the removed reasoning and scores the later actions only for
candidates that passed: the decisions are the same (a candidate failing at j = t fails anyway), the
audit of an early-rejected candidate then holds only d_t.

With `local_only` (not RACE: the ablation's local arm) a candidate is accepted when its own action
passes, d_t <= ε, whatever the later actions lost; the later actions are still scored, so that an
accepted removal updates their baselines as above.

A number that is not finite never accepts: a NaN or infinite score, of the candidate or of the
baseline s_j it is measured against, rejects the candidate with reason `non_finite` (Python's `max`
would skip a NaN that is not first). The batching noise of the scorer must be far below ε
(`check_noise`), or the decisions would depend on how candidates were batched.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from race_core.config import DEFAULT_EPSILON
from race_core.schema import Trajectory
from race_core.scoring import Scorer, ScoreRequest, ScorerStats, batch_noise

# A plain scorer: trajectories -> for each, one action mean log-prob per turn.
PlainScorer = Callable[[list[Trajectory]], list[list[float]]]
# Called after each round: (round t, what it scored, the last round). Round 0 scores every trajectory
# in full, round t >= 1 the candidates t (their count is passed); `race_core.progress` reads it.
Progress = Callable[[int, int, int], None]

# Why a candidate was not accepted (the audit's `reason`; None when accepted).
OVER_EPSILON = "over_epsilon"  # some d_j > ε
NON_FINITE = "non_finite"  # a score (candidate or baseline) is NaN or infinite
EMPTY_REASONING = "empty_reasoning"  # nothing to remove: not scored
NOISE_SHARE = 0.1  # the scorer's batching noise must stay within this share of ε


class ScorerNoiseError(ValueError):
    """The scorer's measured batching noise is not far below ε: its decisions would be noise."""


def check_noise(noise: float, epsilon: float) -> None:
    """Raise `ScorerNoiseError` unless the measured noise is at most `NOISE_SHARE` × ε."""
    if not noise <= NOISE_SHARE * epsilon:  # a NaN noise fails too
        raise ScorerNoiseError(
            f"scorer noise {noise:.2e} is not far below epsilon {epsilon:g} (limit {NOISE_SHARE:g} x epsilon = "
            f"{NOISE_SHARE * epsilon:.2e}): decisions would depend on batching; run the model in float32 "
            f"(--dtype float32) or use a larger epsilon (--epsilon)")


@dataclass
class CoverResult:
    """The compressed trajectory, the turns whose reasoning was removed, and one audit entry per
    candidate turn: {turn, accepted, reason (None when accepted), drops (d_j for j >= turn), max_drop,
    skipped_empty}."""

    trajectory: Trajectory
    skipped_turns: tuple[int, ...]
    audit: list[dict[str, Any]]
    original: Trajectory
    final_scores: list[float] = field(default_factory=list)


class _PlainAdapter:
    """Lets a plain callable serve as a Scorer: it scores whole trajectories, we slice. It renders
    nothing itself (`renderer` is None) and holds nothing (`release`, `close` do nothing)."""

    name = "plain"
    max_length = None
    renderer = None

    def __init__(self, fn: PlainScorer):
        self.fn = fn
        self.stats = ScorerStats()

    def score(self, requests: Sequence[ScoreRequest]) -> list[list[float]]:
        scores = self.fn([r.trajectory for r in requests])
        self.stats.forward_calls += 1
        self.stats.requests += len(requests)
        return [list(s[r.from_turn: r.last_turn + 1]) for r, s in zip(requests, scores, strict=True)]

    def release(self, keys=None) -> None:
        return None

    def measure_noise(self, requests: Sequence[ScoreRequest]) -> float:
        return batch_noise(self, requests)

    def close(self) -> None:
        return None


def as_scorer(scorer: Scorer | PlainScorer) -> Scorer:
    return scorer if hasattr(scorer, "score") else _PlainAdapter(scorer)


def logic_cover(
    trajectories: Sequence[Trajectory],
    scorer: Scorer | PlainScorer,
    epsilon: float = DEFAULT_EPSILON,
    *,
    early_reject: bool = False,
    local_only: bool = False,
    progress: Progress | None = None,
) -> list[CoverResult]:
    """Run the LoGiC cover over all trajectories as a wavefront; one result per input, in order."""
    scorer = as_scorer(scorer)
    n = len(trajectories)
    current = list(trajectories)
    audits: list[list[dict[str, Any]]] = [[] for _ in range(n)]
    skipped: list[list[int]] = [[] for _ in range(n)]
    try:
        scores = scorer.score([ScoreRequest(i, t) for i, t in enumerate(current)])
        rounds = max((len(t.turns) for t in current), default=0)
        if progress is not None and rounds:
            progress(0, n, rounds - 1)
        for t in range(1, rounds):
            candidates: dict[int, Trajectory] = {}
            for i in range(n):
                if t >= len(current[i].turns):
                    continue
                if not current[i].turns[t].reasoning:
                    audits[i].append(_audit(t, EMPTY_REASONING, drops=[]))
                    continue
                candidates[i] = current[i].without_reasoning(t)
            drops = _candidate_drops(scorer, candidates, scores, t, epsilon, early_reject)
            for i, (d, new_scores) in drops.items():
                checked = 1 if local_only else len(scores[i]) - t  # the turns whose drops decide
                reason = _reject_reason(scores[i][t:t + checked], new_scores[:checked], d[:checked], epsilon)
                audits[i].append(_audit(t, reason, drops=d))
                if reason is None:
                    current[i] = candidates[i]
                    scores[i][t:] = new_scores
                    skipped[i].append(t)
            if progress is not None:
                progress(t, len(candidates), rounds - 1)
    finally:
        scorer.release([i for i in range(n)])
    return [CoverResult(trajectory=current[i], skipped_turns=tuple(skipped[i]), audit=audits[i],
                        original=trajectories[i], final_scores=list(scores[i])) for i in range(n)]


def _candidate_drops(scorer: Scorer, candidates: dict[int, Trajectory], scores: list[list[float]],
                     t: int, epsilon: float, early_reject: bool) -> dict[int, tuple[list[float], list[float]]]:
    """For each candidate: (d_j for the turns scored, ℓ̃_j for those turns) starting at turn t."""
    keys = list(candidates)
    if not early_reject:
        new = scorer.score([ScoreRequest(i, candidates[i], from_turn=t) for i in keys])
        return {i: (_drops(scores[i][t:], s), s) for i, s in zip(keys, new, strict=True)}
    first = scorer.score([ScoreRequest(i, candidates[i], from_turn=t, to_turn=t) for i in keys])
    out = {i: (_drops(scores[i][t:t + 1], s), s) for i, s in zip(keys, first, strict=True)}
    rest = [i for i in keys if out[i][0][0] <= epsilon and len(candidates[i].turns) > t + 1]
    later = scorer.score([ScoreRequest(i, candidates[i], from_turn=t + 1) for i in rest])
    for i, s in zip(rest, later, strict=True):
        full = out[i][1] + s
        out[i] = (_drops(scores[i][t:], full), full)
    return out


def _reject_reason(baseline: Sequence[float], candidate: Sequence[float], drops: Sequence[float],
                   epsilon: float) -> str | None:
    """Why the candidate is rejected, or None to accept it: every d_j (j >= t) is scored, finite and <= ε."""
    if not all(math.isfinite(x) for x in (*baseline, *candidate)):
        return NON_FINITE
    if len(candidate) < len(baseline) or max(drops) > epsilon:
        return OVER_EPSILON
    return None


def _drops(before: Sequence[float], after: Sequence[float]) -> list[float]:
    return [float(b) - float(a) for b, a in zip(before, after, strict=False)]


def _audit(turn: int, reason: str | None, *, drops: list[float]) -> dict[str, Any]:
    max_drop = None if not drops else math.nan if any(math.isnan(d) for d in drops) else max(drops)
    return {"turn": turn, "accepted": reason is None, "reason": reason, "drops": drops, "max_drop": max_drop,
            "skipped_empty": reason == EMPTY_REASONING}
