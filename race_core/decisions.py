"""What the cover decided, as plain rows: one per (trajectory, candidate turn), and one per
compressed trajectory. Token counts use the same segment tokenization as scoring."""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import Any

from race_core.cover import CoverResult
from race_core.render import Renderer
from race_core.schema import Trajectory


@dataclass(frozen=True)
class CoverContext:
    """What identifies a cover run: the model, ε, the backend that scored and how it rendered
    (`Renderer.render_mode`: tokenization and what the chat template does with reasoning)."""

    model_digest: str
    epsilon: float
    backend: str
    render_mode: str = ""


def remove_reasoning(trajectory: Trajectory, turns: Iterable[int]) -> Trajectory:
    """The trajectory with the reasoning of `turns` removed (a compressed trajectory)."""
    for k in sorted(turns):
        trajectory = trajectory.without_reasoning(k)
    return trajectory


def reasoning_tokens(renderer: Renderer, trajectory: Trajectory) -> int:
    return sum(len(renderer.encode(turn.reasoning)) for turn in trajectory.turns)


def decision_rows(results: Iterable[CoverResult], renderer: Renderer, ctx: CoverContext) -> Iterator[dict[str, Any]]:
    for result in results:
        turns = result.original.turns
        render_mode = ctx.render_mode
        if any(turn.tool_calls for turn in turns):
            render_mode += f"+tools:{renderer.tool_mode}"  # the template's tool-call format, or the JSON fallback
        action_spans = renderer.render(result.original).action_spans
        for entry in result.audit:
            t = entry["turn"]
            yield {
                "trajectory_id": result.original.id,
                "turn": t,
                "accepted": bool(entry["accepted"]),
                "reason": entry["reason"],  # None when accepted (race_core.cover: over_epsilon, non_finite, ...)
                "skipped_empty": bool(entry["skipped_empty"]),
                "drops": [float(d) for d in entry["drops"]],
                "max_drop": entry["max_drop"],
                "reasoning_tokens": len(renderer.encode(turns[t].reasoning)),
                "action_tokens": action_spans[t][1] - action_spans[t][0],  # the scored tokens
                "epsilon": ctx.epsilon,
                "model_digest": ctx.model_digest,
                "backend": ctx.backend,
                "render_mode": render_mode,
            }


def rejected_by_later(row: dict[str, Any]) -> bool:
    """A candidate the cover rejected although its own action's drop was within ε: only a later
    action lost more than ε (the check that defines RACE bound; a local-only cover would accept it)."""
    drops = list(row["drops"])
    return bool(not row["accepted"] and row["reason"] == "over_epsilon" and len(drops) > 1
                and drops[0] <= row["epsilon"])  # bool: rows read from Parquet hold numpy scalars


@dataclass
class CrossTurn:
    """The cross-turn figure, counted row by row (`add`): of the scored candidates (decision rows,
    `skipped_empty` left out), how many were rejected only by a later action (`rejected_by_later`)."""

    candidates: int = 0
    rejected: int = 0
    rejected_by_later: int = 0

    def add(self, row: dict[str, Any]) -> None:
        if row["skipped_empty"]:
            return
        self.candidates += 1
        self.rejected += not row["accepted"]
        self.rejected_by_later += rejected_by_later(row)

    def figure(self) -> dict[str, Any]:
        """The counts, with the share of the candidates and of the rejected ones (None when there are none)."""
        later = self.rejected_by_later
        return {"candidates": self.candidates, "rejected": self.rejected, "rejected_by_later": later,
                "share": later / self.candidates if self.candidates else None,
                "share_of_rejected": later / self.rejected if self.rejected else None}


def cross_turn_figure(rows: Iterable[dict[str, Any]]) -> dict[str, Any]:
    """`CrossTurn` over all `rows`."""
    count = CrossTurn()
    for row in rows:
        count.add(row)
    return count.figure()


def cross_turn_text(figure: dict[str, Any]) -> str:
    """One line for logs and reports."""
    share = figure.get("share")
    return (f"{figure['rejected_by_later']} of {figure['candidates']} candidates rejected only by a later action"
            + (f" ({100 * share:.1f}%)" if share is not None else ""))


def local_accepted_race_rejected(race: dict[str, Iterable[int]], local: dict[str, Iterable[int]]) -> dict[str, Any]:
    """Of the removals a local-only cover accepted (trajectory id -> turns), how many RACE rejected
    on the same trajectories (`race`: its accepted removals)."""
    accepted = rejected = 0
    for trajectory_id, turns in local.items():
        kept = set(race.get(trajectory_id, ()))
        for turn in turns:
            accepted += 1
            rejected += turn not in kept
    return {"local_accepted": accepted, "race_rejected": rejected,
            "share": rejected / accepted if accepted else None}
