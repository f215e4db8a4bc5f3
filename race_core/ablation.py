"""The ablation's arms (`race ablate`, issue 17): five versions of the same trajectories.

- `none`: every turn's reasoning kept.
- `race`: the LoGiC cover at ε (every later action checked): the pipeline's compress output.
- `local`: the cover that checks only the turn's own action (`logic_cover(local_only=True)`).
- `random`: in each trajectory, as many turns as `race` removed there, drawn at random among the
  candidate turns (turn >= 1 with reasoning), so counts match trajectory by trajectory.
- `all`: the reasoning of every turn after turn 0 removed.

`removed_by_kind` reads each candidate turn's kind from its text (the `reasoning_kind` of the
trajectory's environment, the calculator's for one it does not name) and says which share of each
kind an arm removed: what the table's success figures are read against.
"""

from __future__ import annotations

import random
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from race_core.envs import DEFAULT_ENV, environment_named, get_environment
from race_core.envs.base import REASONING_KINDS
from race_core.schema import Trajectory

ARMS = ("none", "race", "local", "random", "all")
DERIVED_ARMS = ("none", "random", "all")  # made from the trajectories and the race arm's counts
COVER_ARMS = {"race": False, "local": True}  # arm -> local_only of its cover


def candidate_turns(trajectory: Trajectory) -> list[int]:
    """The turns a cover may remove: turn >= 1 with reasoning."""
    return [k for k in range(1, len(trajectory.turns)) if trajectory.turns[k].reasoning]


def derived_removal(arm: str, trajectory: Trajectory, race_removed: int, seed: int = 0) -> list[int]:
    """The turns whose reasoning `arm` (one of DERIVED_ARMS) removes from `trajectory`; `race_removed`:
    how many the race arm removed there. The random draw depends on (seed, trajectory id) only."""
    candidates = candidate_turns(trajectory)
    if arm == "none":
        return []
    if arm == "all":
        return candidates
    if arm == "random":
        if not 0 <= race_removed <= len(candidates):
            raise ValueError(f"trajectory {trajectory.id}: race removed {race_removed} of {len(candidates)} candidates")
        return sorted(random.Random(f"{seed}:{trajectory.id}").sample(candidates, race_removed))
    raise ValueError(f"not a derived arm: {arm!r} (one of {DERIVED_ARMS})")


def removed_by_kind(originals: Iterable[Trajectory], removed: Mapping[str, Sequence[int]]) -> dict[str, dict[str, Any]]:
    """kind -> {candidates, removed, share}: of the candidate turns of each kind, how many were removed
    (`removed`: trajectory id -> its removed turns; a trajectory not in it had none removed)."""
    counts = {kind: [0, 0] for kind in REASONING_KINDS if kind != "empty"}
    for t in originals:
        gone = set(removed.get(t.id, ()))
        env = environment_named(t.environment) or get_environment(DEFAULT_ENV)
        for k in candidate_turns(t):
            entry = counts[env.reasoning_kind(t.turns[k].reasoning)]
            entry[0] += 1
            entry[1] += k in gone
    return {kind: {"candidates": n, "removed": r, "share": r / n if n else None} for kind, (n, r) in counts.items()}
