"""The pool's child flow (docs/architecture.md §8 scale-out): `race-units` does a group of a stage's units (cover
shards, sample chunks) on one device.

`race serve` deploys it to the process work pool (`race-units/<pool>`) by module entrypoint
(`flows.shard:race_units`): a `race worker` of that pool runs it from the installed package, with
no code pulled from the serving host. The parent is a stage whose resources name the pool
(`tasks.executors.pool`). The child rebuilds the job from its kind and spec
(`tasks.units.job_from_spec`, which fails if this worker's code would key the units otherwise), so
it needs only the store URL and what the spec names in it: the model is a checkpoint object of the
store, fetched once per worker host into its cache. The device is the worker's (`RACE_DEVICE`, set
by `race worker --device`), else the spec's. While it runs a child keeps its lease in the store
(`tasks.executors.pool.Lease`, which carries the cover's progress figures to the parent) and holds
one slot of the `gpu` global concurrency limit when `race serve --gpu-slots` set one. Each unit is
committed create-if-absent by the same code as in one process; the parent merges.
"""

from __future__ import annotations

import logging
import os
from typing import Any

from prefect import flow

logger = logging.getLogger(__name__)

DEVICE_ENV = "RACE_DEVICE"
GPU_LIMIT = "gpu"


@flow(name="race-units", log_prints=True)
def race_units(store: str, kind: str, spec: dict[str, Any], units: list[dict[str, Any]],
               force: bool = False) -> dict[str, Any]:
    """Do the `units` of the job (`kind`, `spec`) on this worker's device; returns counts."""
    from prefect.artifacts import create_progress_artifact, update_progress_artifact
    from prefect.concurrency.sync import concurrency
    from prefect.runtime import flow_run

    from flows.roots import allowed_roots, check_within_roots
    from race_core.progress import ProgressFigures
    from storage import ArtifactStore
    from tasks.executors.pool import Lease
    from tasks.units import job_from_spec

    artifacts = ArtifactStore(store)
    device = os.environ.get(DEVICE_ENV) or spec.get("resources", {}).get("device", "cpu")
    counts = {"committed": 0, "dropped": 0, "skipped": 0, "read_bytes": 0, "load_s": 0.0}
    # the lease first: rebuilding the job imports the model stack, which on a loaded host can take longer
    # than the parent's lease_timeout, and a running child without a lease reads as a dead one
    with Lease(artifacts, str(flow_run.id), device) as lease:
        check_within_roots({"store": store}, allowed_roots())
        job = job_from_spec(kind, spec)
        with concurrency(GPU_LIMIT, occupy=1, strict=False):
            logger.info(f"{job.what}: {job.noun} {[job.index(u) for u in units]} on {device}")
            progress_id = create_progress_artifact(0.0, description=f"{job.what} {job.noun}: starting")

            def publish(figures: ProgressFigures) -> None:  # to the parent through the lease, and to this run's UI
                lease.report(figures)
                update_progress_artifact(progress_id, round(100 * figures.fraction, 1),
                                         description=f"{job.what} {job.noun}: {figures.summary()}")

            worker = job.worker(artifacts, device, publish, planned=units)
            try:
                for unit in units:
                    done = worker.run(unit, force)
                    outcome = "skipped" if done["skipped"] else "committed" if done["committed"] else "dropped"
                    counts[outcome] += 1
                    counts["read_bytes"] += done["read_bytes"]
                    counts["load_s"] += done["load_s"]
            finally:
                worker.close()
    logger.info(f"{job.noun}: {counts['committed']} committed, {counts['dropped']} committed elsewhere first, "
                f"{counts['skipped']} found committed; {counts['read_bytes']} bytes of input read")
    return counts
