"""Prefect deployments (docs/architecture.md §8):

- `race-pipeline/manual`: the whole pipeline; its one parameter, the `PipelineConfig`, is a nested
  form in the UI, editable before each run.
- `race-nightly/nightly`: recompress what is new in an inbox, on a cron schedule (02:00 UTC). Its
  runs are serialized (a deployment concurrency limit of 1; a run started while one is running
  waits in the queue): two runs at once would both score what the catalog does not hold yet and
  append overlapping parts.

- `race-units/<pool>` (default pool `race-gpu`): a group of a stage's units (cover shards, sample
  chunks), run by a `race worker` of the process work pool `<pool>` as a child flow run of a stage
  whose resources name the pool (`flows.shard`, `tasks.executors.pool`). `race serve` creates the
  pool (type process), sets the `gpu` global concurrency limit when `--gpu-slots` is given, and
  deploys the flow by module entrypoint: workers run it from their installed package.

`race serve` serves the first two to the Prefect server named by PREFECT_API_URL. They are
instances of the configs in `race_core.config`: `build_deployments(nightly)` derives the manual
run's defaults (checkpoint, store, ingest, cover, resources) from the nightly config.
"""

from __future__ import annotations

import dataclasses
import time
from typing import Any

from race_core.config import NightlyConfig, PipelineConfig

NIGHTLY_CRON = "0 2 * * *"
DEFAULT_POOL = "race-gpu"
MANUAL_INPUTS = ("data/*.jsonl",)
SERVE_DEFAULTS = NightlyConfig(checkpoint=".race/checkpoints/policy")  # `race serve` without options


def manual_config(nightly: NightlyConfig) -> PipelineConfig:
    """The manual deployment's defaults: the nightly run's model, store and cover settings."""
    return PipelineConfig(inputs=MANUAL_INPUTS, checkpoint=nightly.checkpoint, store=nightly.store,
                          ingest=nightly.ingest, cover=nightly.cover, resources=nightly.resources)


def build_deployments(nightly: NightlyConfig = SERVE_DEFAULTS, cron: str = NIGHTLY_CRON, timezone: str = "UTC") -> list[Any]:
    from prefect.client.schemas.objects import ConcurrencyLimitConfig, ConcurrencyLimitStrategy
    from prefect.schedules import Cron

    from flows.nightly import race_nightly
    from flows.pipeline import race_pipeline

    manual = race_pipeline.to_deployment(
        name="manual",
        description="Run the RACE pipeline on your trajectories; edit the parameters before each run.",
        parameters={"config": dataclasses.asdict(manual_config(nightly))},
        tags=["race"],
    )
    scheduled = race_nightly.to_deployment(
        name="nightly",
        description="Compress trajectories not yet compressed for this model and epsilon; appends a part.",
        schedules=[Cron(cron, timezone=timezone)],
        parameters={"config": dataclasses.asdict(nightly)},
        tags=["race", "nightly"],
        concurrency_limit=ConcurrencyLimitConfig(limit=1, collision_strategy=ConcurrencyLimitStrategy.ENQUEUE),
    )
    return [manual, scheduled]


def prepare_pool(pool: str = DEFAULT_POOL, gpu_slots: int | None = None, log=print) -> str:
    """Create the process work pool `pool` (kept if it exists) and deploy the child flow `race-units`
    to it by module entrypoint (`flows.shard:race_units`): a worker imports it from its installed
    race-pipeline, so no code is pulled from this host and workers may run anywhere that reaches the
    server and the store. `gpu_slots`: slots of the `gpu` global concurrency limit, the child runs
    doing units at once across the pool; None removes the limit, so every worker of the pool works
    (each runs one child at a time: as many at once as the pool has workers). Returns the
    deployment's name."""
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.actions import WorkPoolCreate
    from prefect.deployments.runner import EntrypointType
    from prefect.exceptions import ObjectAlreadyExists, ObjectNotFound

    from flows.shard import GPU_LIMIT, race_units
    from tasks.executors.pool import deployment_name

    if gpu_slots is not None and gpu_slots < 1:
        raise ValueError(f"--gpu-slots: {gpu_slots} is not >= 1")
    with get_client(sync_client=True) as client:
        try:
            client.create_work_pool(WorkPoolCreate(name=pool, type="process"))
        except ObjectAlreadyExists:
            pass
        if gpu_slots is not None:
            client.upsert_global_concurrency_limit_by_name(GPU_LIMIT, gpu_slots)
        else:
            try:
                client.delete_global_concurrency_limit_by_name(GPU_LIMIT)
            except ObjectNotFound:
                pass
    race_units.deploy(name=pool, work_pool_name=pool, entrypoint_type=EntrypointType.MODULE_PATH, build=False,
                      push=False, print_next_steps=False, ignore_warnings=True, tags=["race", "gpu"],
                      description="Do a group of a stage's units (cover shards, sample chunks) on this worker's "
                                  "device (child runs of a cover or sample stage).")
    slots = f"{gpu_slots} slot(s)" if gpu_slots is not None else "none (one child run per worker)"
    log(f"race serve: work pool {pool!r} (process) with deployment {deployment_name(pool)!r}; concurrency limit "
        f"{GPU_LIMIT!r}: {slots}. Start one worker per device: race worker --pool {pool} --device cuda:N")
    return deployment_name(pool)


def serve_deployments(nightly: NightlyConfig, cron: str = NIGHTLY_CRON, limit: int | None = None,
                      log=print, pool: str = DEFAULT_POOL, gpu_slots: int | None = None) -> None:
    """Prepare the shard pool (`prepare_pool`), then register the manual and nightly deployments
    with the server and run their flow runs here until stopped.

    Prefect's runner stops (after pausing the deployments) when its polling for scheduled runs
    fails a few times in a row, i.e. after about a minute without the server. Then this waits for
    the server to answer and serves again (registering the deployments again, unpaused), so a
    server restart of any length is survived; an error while the server answers is raised."""
    from prefect import serve

    keep_watching_for_cancellation()
    prepare_pool(nightly.resources.pool or pool, gpu_slots, log)
    while True:
        try:
            serve(*build_deployments(nightly, cron), limit=limit)
        except Exception as exc:  # noqa: BLE001 - re-raised unless the server is away
            if api_answers():
                raise
            log(f"race serve: lost the Prefect server ({type(exc).__name__}); serving again once it answers")
        else:
            if api_answers():
                return  # stopped on purpose
            log("race serve: the runner stopped without the Prefect server; serving again once it answers")
        while not api_answers():
            time.sleep(5)
        log("race serve: the Prefect server answers again; serving")


def api_answers() -> bool:
    """Whether the Prefect API (PREFECT_API_URL) answers its health check."""
    import urllib.request

    from prefect.settings import PREFECT_API_URL

    try:
        return urllib.request.urlopen(f"{PREFECT_API_URL.value()}/health", timeout=5).status == 200
    except OSError:
        return False


def keep_watching_for_cancellation() -> None:
    """Make the runner's cancellation observer outlive a server restart.

    Prefect 3.7's runner watches for cancelled runs over a websocket and, when that drops, by
    polling; the polling loop gives up after a few consecutive failures (about 30 s of server
    downtime: "Service exceeded error threshold ... flow run cancellation will fail") and never
    comes back, so a run cancelled from the UI after a restart keeps running. Here a failed polling
    loop is logged and started again, so once the server answers, cancellations work again."""
    import asyncio

    from prefect._internal.observers import FlowRunCancellingObserver
    from prefect.utilities.services import critical_service_loop

    if getattr(FlowRunCancellingObserver, "_race_keeps_watching", False):
        return

    def handle_polling_task_done(self, task: asyncio.Task) -> None:
        if task.cancelled() or self._is_shutting_down:
            return
        if task.exception() is None:
            return
        self.logger.warning("cancellation polling failed (%s); polling again", task.exception())
        self._polling_task = asyncio.create_task(critical_service_loop(
            workload=self._check_for_cancelled_flow_runs, interval=self.polling_interval, jitter_range=0.3))
        self._polling_task.add_done_callback(lambda t: handle_polling_task_done(self, t))

    FlowRunCancellingObserver._handle_polling_task_done = handle_polling_task_done
    FlowRunCancellingObserver._race_keeps_watching = True
