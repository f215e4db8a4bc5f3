"""The pool's child flows (DESIGN §8 scale-out): `race-score-shard` scores a group of the cover's
shards on one device, `race-sample-chunk` plays chunks of an RL iteration's training tasks.

`race serve` deploys both to the process work pool (`<flow>/<pool>`); a `race worker` of that pool
runs them as child flow runs of a cover or sample stage with `resources.pool` set (`tasks.pool`).
The device is the worker's (`RACE_DEVICE`, set by `race worker --device`), else
`resources.device`. While it runs a child keeps its lease in the store (`tasks.pool.Lease`, which
carries the cover's progress figures to the parent) and holds one slot of the `gpu` global
concurrency limit (when `race serve --gpu-slots` created it). It works with the same code as the one
process path (`tasks.shards.score_shards`, `tasks.chunks.sample_and_commit`) and commits each unit's
manifest create-if-absent; the parent merges.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import replace
from typing import Any

from prefect import flow, get_run_logger

from race_core.config import CoverConfig, Resources, RLConfig

DEVICE_ENV = "RACE_DEVICE"
GPU_LIMIT = "gpu"


@contextmanager
def _on_this_worker(store: str, resources: Resources, checkpoint: str | None, model_digest: str,
                    same_scope: Callable[[Resources], bool], unit: str) -> Iterator[tuple[Any, Resources, Any]]:
    """Around a child run's work: this worker's device, the run's lease, the allowed roots, the checks
    that this worker has the submitting run's code (`same_scope`) and model, and a `gpu` slot.
    Yields (the store, the resources on this device, the lease)."""
    from prefect.concurrency.sync import concurrency
    from prefect.runtime import flow_run

    from flows.roots import allowed_roots, check_within_roots
    from race_core.policy import checkpoint_digest
    from storage import ArtifactStore
    from tasks.pool import Lease

    artifacts = ArtifactStore(store)
    device = os.environ.get(DEVICE_ENV) or resources.device
    sized = replace(resources, device=device, pool="")
    with Lease(artifacts, str(flow_run.id), device) as lease:
        check_within_roots({"store": store, **({"checkpoint": checkpoint} if checkpoint else {})}, allowed_roots())
        if not same_scope(sized):
            raise ValueError(f"this worker's code or library versions differ from the submitting run's ({unit} scope "
                             "mismatch): install the same version of race-pipeline on every worker")
        if checkpoint and checkpoint_digest(checkpoint) != model_digest:
            raise ValueError(f"parameter 'checkpoint': {checkpoint!r} on this worker is not the model the run "
                             f"submitted (digest {model_digest[:12]}): every worker needs the same checkpoint")
        with concurrency(GPU_LIMIT, occupy=1, strict=False):
            yield artifacts, sized, lease


@flow(name="race-score-shard", log_prints=True)
def race_score_shard(store: str, trajectories: str, checkpoint: str, model_digest: str, scope: str,
                     config: CoverConfig, resources: Resources, shards: list[dict[str, Any]],
                     force: bool = False) -> dict[str, Any]:
    """Score the `shards` ({index, ids}) of the `trajectories` dataset into the store; returns counts."""
    from prefect.artifacts import create_progress_artifact, update_progress_artifact

    from race_core.progress import CoverProgress, ProgressFigures
    from tasks.shards import Shard, ShardScorer, score_shards, shard_scope
    from tasks.stages import cover_scorer

    log = get_run_logger().info
    planned = [Shard(int(s["index"]), tuple(s["ids"])) for s in shards]
    with _on_this_worker(store, resources, checkpoint, model_digest,
                         lambda sized: shard_scope(config, sized, model_digest) == scope, "shard") as (
            artifacts, sized, lease):
        log(f"scoring shards {[s.index for s in planned]} on {sized.device}")
        progress_id = create_progress_artifact(0.0, description="LoGiC cover shards: starting")

        def publish(figures: ProgressFigures) -> None:  # to the parent through the lease, and to this run's UI
            lease.report(figures)
            update_progress_artifact(progress_id, round(100 * figures.fraction, 1),
                                     description=f"LoGiC cover shards: {figures.summary()}")

        shown = CoverProgress(sum(len(s.ids) for s in planned), log=log, publish=publish)
        work = ShardScorer(config, model_digest, lambda: cover_scorer(config, checkpoint, sized), shown)
        try:
            counts = score_shards(artifacts, trajectories, planned, scope, sized.shard_size, work, log,
                                  device=sized.device, force=force)
        finally:
            shown.close()
            work.close()
    log(f"shards: {counts['scored']} scored and committed, {counts['dropped']} committed elsewhere first")
    return counts


@flow(name="race-sample-chunk", log_prints=True)
def race_sample_chunk(store: str, policy: dict[str, Any], config: RLConfig, resources: Resources, iteration: int,
                      scope: str, chunks: list[int], force: bool = False) -> dict[str, Any]:
    """Play the `chunks` of RL iteration `iteration` with `policy` (a `PolicyRef` as a dict) and
    commit their rollouts to the store; returns counts."""
    from tasks.chunks import sample_and_commit
    from tasks.training_stages import PolicyRef, sample_scope

    log = get_run_logger().info
    ref = PolicyRef(**policy)
    with _on_this_worker(store, resources, ref.path, ref.digest,
                         lambda sized: sample_scope(ref, config, sized, iteration) == scope, "chunk") as (
            artifacts, sized, _):
        log(f"sampling chunks {chunks} of iteration {iteration} on {sized.device}")
        counts = sample_and_commit(artifacts, scope, list(chunks), lambda: ref.load(artifacts, sized), config,
                                   iteration, log, device=sized.device, force=force)
    log(f"chunks: {counts['sampled']} sampled and committed, {counts['dropped']} committed elsewhere first")
    return counts
