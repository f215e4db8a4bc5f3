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
