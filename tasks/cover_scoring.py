"""Scoring the cover's trajectories in one process: the scorer the cover builds, the trajectories
too long to score, and `ShardScorer`, which scores shard after shard with one scorer (docs/architecture.md §4).
`tasks.shards` commits what it scores (and, when memory runs out, scores a shard again with the
`shrunk` resources)."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

from race_core.config import CoverConfig, Resources, key_fields
from race_core.schema import Reject, Trajectory


def cover_key_config(config: CoverConfig, resources: Resources) -> dict[str, Any]:
    """What the cover's decisions depend on: its config and the dtype the model ran in."""
    return {**key_fields(config), "dtype": resources.dtype}


def cover_scorer(config: CoverConfig, checkpoint: str, resources: Resources):
    """The scorer the cover stage builds when it is given none (the ε sweep builds its shared one here)."""
    from race_core.scoring import make_scorer

    kv = {"kv_budget": resources.kv_budget} if config.backend == "hf" else {}  # vLLM sizes its own cache
    return make_scorer(config.backend, checkpoint, device=resources.device, dtype=resources.dtype,
                       batch_size=resources.batch_size, **kv, **resources.engine_options(config.backend))


def _within(shard: list[Trajectory], renderer, limit: int | None, max_tokens: int, refused: Any, progress: Any
            ) -> list[Trajectory]:
    """The trajectories of `shard` that fit in `limit` tokens; the others become `too_long` rejects
    (each logged through `progress`, a `race_core.progress.CoverProgress`)."""
    if limit is None or renderer is None:
        return shard
    kept = []
    for trajectory in shard:
        length = len(renderer.render(trajectory))
        if length <= limit:
            kept.append(trajectory)
            continue
        bound = "--max-tokens" if max_tokens and limit == max_tokens else "the model's context"
        refused.write(Reject(file="", line=0, code="too_long", field="turns", trajectory_id=trajectory.id,
                             message=f"renders to {length} tokens, over {bound} of {limit}: not scored"))
        progress.log(f"cover: trajectory {trajectory.id[:12]} renders to {length} tokens (limit {limit}): rejected "
                     "as too_long", logging.WARNING)
    return kept


@dataclass
class ShardScorer:
    """Scores shards in one process: the scorer is built on the first trajectory that needs it and
    the scorer's noise measured once, on its first shard (as the one-loop cover did)."""

    config: CoverConfig
    model_digest: str
    make_scorer: Callable[[], Any]
    progress: Any  # race_core.progress.CoverProgress
    scorer: Any = None
    noise: float | None = None
    limit: int | None = None
    ctx: Any = None
    load_s: float = 0.0  # time the scorer (the model) took to load

    def _ready(self) -> Any:
        if self.scorer is None:
            from race_core.decisions import CoverContext
            from race_core.memory import format_size

            started = time.perf_counter()
            self.scorer = self.make_scorer()
            self.load_s = time.perf_counter() - started
            extra = self.scorer.stats.extra
            if extra.get("kv_budget"):
                self.progress.log(f"cover: KV-prefix copies kept within {format_size(extra['kv_budget'])} "
                                  f"({format_size(extra['kv_bytes_per_token'])} per token)")
            self.limit = min((n for n in (self.config.max_tokens, self.scorer.max_length) if n), default=None)
            renderer = self.scorer.renderer
            self.ctx = CoverContext(model_digest=self.model_digest, epsilon=self.config.epsilon,
                                    backend=self.config.backend,
                                    render_mode=renderer.render_mode if renderer else "plain")
        return self.scorer

    def score(self, trajectories: list[Trajectory], refused: Any) -> tuple[list[dict[str, Any]], int, dict[str, Any]]:
        """Decision rows of the trajectories that fit (too long ones go to `refused`), the tokens
        this took, and the cover's work counters (the noise measurement left out) with the work
        bound's tokens (`bound_tokens`)."""
        from race_core.cover import check_noise, logic_cover
        from race_core.decisions import decision_rows
        from race_core.progress import bound_tokens_by_round
        from race_core.scoring import ScoreRequest

        scorer = self._ready()
        tokens_before = scorer.stats.tokens_processed
        kept = _within(trajectories, scorer.renderer, self.limit, self.config.max_tokens, refused, self.progress)
        self.progress.skip(len(trajectories) - len(kept))
        if not kept:
            return [], 0, {}
        if self.noise is None:
            self.noise = scorer.measure_noise([ScoreRequest(("noise", i), t) for i, t in enumerate(kept[:4])])
            self.progress.log(f"cover: scorer noise {self.noise:.2e} (epsilon {self.config.epsilon:g})")
            check_noise(self.noise, self.config.epsilon)
        before = scorer.stats.work()
        results = logic_cover(kept, scorer, self.config.epsilon, early_reject=self.config.early_reject,
                              local_only=self.config.local_only,
                              progress=self.progress.shard(kept, scorer.renderer))
        rows = list(decision_rows(results, scorer.renderer, self.ctx))
        work = {**(scorer.stats.work() - before).counts(), "bound_tokens": sum(
            sum(bound_tokens_by_round(t, scorer.renderer)) for t in kept) if scorer.renderer else None}
        if scorer.renderer is not None:
            scorer.renderer.forget()  # texts recur within a shard, not across: memory flat in dataset size
        return rows, scorer.stats.tokens_processed - tokens_before, work

    def close(self) -> None:
        if self.scorer is not None:
            self.scorer.close()


KV_BUDGET_FLOOR = 64 * 2**20  # out-of-memory retries do not halve the KV budget below this (64 MiB)


def can_shrink(resources: Resources) -> bool:
    """Whether `shrunk` has anything left to halve."""
    return resources.batch_size > 1 or not 0 < resources.kv_budget <= KV_BUDGET_FLOOR


def shrunk(resources: Resources) -> tuple[Resources, str]:
    """The resources of a cover's next try after it ran out of memory, and what changed: what grows
    with the work halved, the batch size (down to 1) and the hf scorer's KV budget (down to
    KV_BUDGET_FLOOR; an automatic one is first resolved on the memory free now)."""
    from race_core.memory import automatic_kv_budget, format_size

    kv_budget = resources.kv_budget or automatic_kv_budget(resources.device)
    smaller = replace(resources, batch_size=max(1, resources.batch_size // 2),
                      kv_budget=min(kv_budget, max(KV_BUDGET_FLOOR, kv_budget // 2)))
    was = (format_size(kv_budget) if resources.kv_budget
           else f"automatic: half the free memory, {format_size(kv_budget)} now")
    return smaller, (f"batch size {smaller.batch_size} (was {resources.batch_size}) and KV budget "
                     f"{format_size(smaller.kv_budget)} (was {was})")
