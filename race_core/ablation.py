"""The ablation's arms (`race ablate`, issue 17): five versions of the same trajectories.

- `none`: every turn's reasoning kept.
- `race`: the LoGiC cover at ε (every later action checked): the pipeline's compress output.
- `local`: the cover that checks only the turn's own action (`logic_cover(local_only=True)`).
- `random`: in each trajectory, candidate turns (turn >= 1 with reasoning) drawn at random until their
  reasoning tokens come closest to the tokens `race` removed there, so that the arms compare at
  matched reasoning tokens, trajectory by trajectory (not at matched turn counts: RACE keeps the
  short notes and removes the long restatements, and a count-matched draw removes more tokens).
- `all`: the reasoning of every turn after turn 0 removed.

`removed_by_kind` reads each candidate turn's kind from its text (the `reasoning_kind` of the
trajectory's environment, the calculator's for one it does not name) and says which share of each
kind an arm removed: what the table's success figures are read against.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

from race_core.envs import DEFAULT_ENV, environment_named, get_environment
from race_core.envs.base import REASONING_KINDS
from race_core.schema import Trajectory

ARMS = ("none", "race", "local", "random", "all")
RL_ARMS = ("none+grpo", "race+rl", "race+grpo", "race+close")  # the paper's RL rows; +lp<λ>, +adapt<δ> beside them


def rl_phases(length_penalties: Sequence[float] = (), skip_bonuses: Sequence[float] = (),
              arms: Sequence[str] | None = None) -> list[tuple[str, str, dict[str, Any]]]:
    """(SFT arm, phase, RLConfig fields) of each RL run an ablation makes, named `<arm>+<phase>` in
    its tables (the paper's Table 2 rows and the users' alternatives, on the same rollout budget):
    - `none+grpo`: SFT on the trajectories as they came, then plain GRPO (the paper's baseline);
    - `race+rl`: RACE-SFT, then cover-aware RL (the method);
    - `race+grpo`: RACE-SFT, then plain GRPO (no LoGiC in RL);
    - `race+close`: RACE-SFT, then RL with the closure term alone (no reasoning mask);
    - `race+grpo+lp<λ>`: RACE-SFT, then GRPO with a reasoning-length penalty λ per token;
    - `race+adapt<δ>`: RACE-SFT, then GRPO with an AdaptThink-style reward (+ δ × the share of turns
      without reasoning, on successful rollouts).
    `arms`: which of them (default every one)."""
    runs = [("none", "grpo", {"cover_aware": False}), ("race", "rl", {"cover_aware": True}),
            ("race", "grpo", {"cover_aware": False}), ("race", "close", {"cover_aware": True, "mask_reasoning": False}),
            *(("race", f"grpo+lp{lam:g}", {"cover_aware": False, "length_penalty": lam}) for lam in length_penalties),
            *(("race", f"adapt{delta:g}", {"cover_aware": False, "skip_bonus": delta}) for delta in skip_bonuses)]
    return [run for run in runs if arms is None or f"{run[0]}+{run[1]}" in arms]


def phases_of(entry: Mapping[str, Any]) -> list[str]:
    """The RL phases an ablation entry holds, in `rl_phases` order (rl, grpo, close, then grpo+lp by λ,
    adapt by δ), whatever order its keys came in (a JSON file's are sorted)."""
    found = [k for k, v in entry.items() if isinstance(v, Mapping) and "success_rate" in v]
    first = {"rl": 0, "grpo": 1, "close": 2}

    def order(name: str) -> tuple[int, float]:
        if name in first:
            return first[name], 0.0
        if name.startswith("grpo+lp"):
            return 3, float(name.removeprefix("grpo+lp"))
        return 4, float(name.removeprefix("adapt")) if name.startswith("adapt") else 0.0

    return sorted(found, key=order)


DERIVED_ARMS = ("none", "random", "all")  # made from the trajectories and the race arm's counts
COVER_ARMS = {"race": False, "local": True}  # arm -> local_only of its cover


def candidate_turns(trajectory: Trajectory) -> list[int]:
    """The turns a cover may remove: turn >= 1 with reasoning."""
    return [k for k in range(1, len(trajectory.turns)) if trajectory.turns[k].reasoning]


def derived_removal(arm: str, trajectory: Trajectory, race_removed: Sequence[int], seed: int = 0,
                    tokens: Callable[[str], int] = len) -> list[int]:
    """The turns whose reasoning `arm` (one of DERIVED_ARMS) removes from `trajectory`; `race_removed`:
    the turns the race arm removed there; `tokens`: a reasoning text's token count (the tokenizer's).
    The random draw depends on (seed, trajectory id) only: the candidates in a random order, each
    taken when it brings the removed tokens closer to the race arm's."""
    candidates = candidate_turns(trajectory)
    if arm == "none":
        return []
    if arm == "all":
        return candidates
    if arm == "random":
        if not set(race_removed) <= set(candidates):
            raise ValueError(f"trajectory {trajectory.id}: race removed turns {sorted(race_removed)}, not all of them "
                             f"candidates {candidates}")
        count = {k: tokens(trajectory.turns[k].reasoning) for k in candidates}
        target, total, chosen = sum(count[k] for k in race_removed), 0, []
        for k in random.Random(f"{seed}:{trajectory.id}").sample(candidates, len(candidates)):
            if abs(total + count[k] - target) < abs(total - target):
                chosen.append(k)
                total += count[k]
        return sorted(chosen)
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
