"""`race-score-shard`: score a group of the cover's shards on one device (DESIGN §8 scale-out).

Deployed by `race serve` to the process work pool (`race-score-shard/<pool>`) and run by a `race
worker` of that pool, as a child flow run of a cover stage with `resources.pool` set (`tasks.pool`).
The device is the worker's (`RACE_DEVICE`, set by `race worker --device`), else
`resources.device`. While it runs it keeps its lease in the store (`tasks.pool.Lease`) and holds
one slot of the `gpu` global concurrency limit (when `race serve --gpu-slots` created it). It
scores with the same code as the one-process cover (`tasks.shards.score_shards`) and commits each
shard's manifest create-if-absent; the parent merges.
"""

from __future__ import annotations

import os
from dataclasses import replace
from typing import Any

from prefect import flow, get_run_logger

from race_core.config import CoverConfig, Resources

DEVICE_ENV = "RACE_DEVICE"
GPU_LIMIT = "gpu"


@flow(name="race-score-shard", log_prints=True)
def race_score_shard(store: str, trajectories: str, checkpoint: str, model_digest: str, scope: str,
                     config: CoverConfig, resources: Resources, shards: list[dict[str, Any]],
                     force: bool = False) -> dict[str, Any]:
    """Score the `shards` ({index, ids}) of the `trajectories` dataset into the store; returns counts."""
    from prefect.concurrency.sync import concurrency
    from prefect.runtime import flow_run

    from flows.roots import allowed_roots, check_within_roots
    from race_core.policy import checkpoint_digest
    from race_core.progress import CoverProgress
    from storage import ArtifactStore
    from tasks.pool import Lease
    from tasks.shards import Shard, ShardScorer, score_shards, shard_scope
    from tasks.stages import cover_scorer

    log = get_run_logger().info
    artifacts = ArtifactStore(store)
    device = os.environ.get(DEVICE_ENV) or resources.device
    sized = replace(resources, device=device, pool="")
    with Lease(artifacts, str(flow_run.id), device):
        check_within_roots({"store": store, "checkpoint": checkpoint}, allowed_roots())
        if shard_scope(config, sized, model_digest) != scope:
            raise ValueError("this worker's cover code or library versions differ from the submitting run's "
                             "(shard scope mismatch): install the same version of race-pipeline on every worker")
        if checkpoint_digest(checkpoint) != model_digest:
            raise ValueError(f"parameter 'checkpoint': {checkpoint!r} on this worker is not the model the run "
                             f"submitted (digest {model_digest[:12]}): every worker needs the same checkpoint")
        planned = [Shard(int(s["index"]), tuple(s["ids"])) for s in shards]
        log(f"scoring shards {[s.index for s in planned]} on {device}")
        shown = CoverProgress(sum(len(s.ids) for s in planned), log=log)
        work = ShardScorer(config, model_digest, lambda: cover_scorer(config, checkpoint, sized), shown)
        try:
            with concurrency(GPU_LIMIT, occupy=1, strict=False):
                counts = score_shards(artifacts, trajectories, planned, scope, sized.shard_size, work, log,
                                      device=device, force=force)
        finally:
            shown.close()
            work.close()
    log(f"shards: {counts['scored']} scored and committed, {counts['dropped']} committed elsewhere first")
    return counts
