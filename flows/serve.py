"""`race serve` (docs/architecture.md §8): the declared deployments (`deployments`) made Prefect
deployments, the shard pool created and the child flow deployed to it, and the manual and nightly
deployments served from this process until it is stopped, through server restarts.
"""

from __future__ import annotations

import importlib
import logging
import time
from typing import Any

from deployments import DEFAULT_POOL, NIGHTLY_CRON, Deployment, declared, units_deployment
from race_core.config import NightlyConfig

logger = logging.getLogger(__name__)


def flow_of(deployment: Deployment) -> Any:
    """The flow object a declaration names (`module:function`)."""
    module, name = deployment.flow.split(":")
    return getattr(importlib.import_module(module), name)


def runner_deployment(deployment: Deployment) -> Any:
    """A declaration as a deployment `prefect.serve` runs in this process."""
    from prefect.client.schemas.objects import ConcurrencyLimitConfig, ConcurrencyLimitStrategy
    from prefect.schedules import Cron

    return flow_of(deployment).to_deployment(
        name=deployment.name, description=deployment.description, parameters=deployment.parameters,
        tags=list(deployment.tags),
        schedules=[Cron(deployment.cron, timezone=deployment.timezone)] if deployment.cron else None,
        concurrency_limit=ConcurrencyLimitConfig(limit=1, collision_strategy=ConcurrencyLimitStrategy.ENQUEUE)
        if deployment.serialized else None)


def prepare_pool(pool: str = DEFAULT_POOL, gpu_slots: int | None = None) -> str:
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

    from flows.shard import GPU_LIMIT
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
    units = units_deployment(pool)
    flow_of(units).deploy(name=units.name, work_pool_name=pool, entrypoint_type=EntrypointType.MODULE_PATH,
                          build=False, push=False, print_next_steps=False, ignore_warnings=True,
                          tags=list(units.tags), description=units.description)
    slots = f"{gpu_slots} slot(s)" if gpu_slots is not None else "none (one child run per worker)"
    logger.info(f"race serve: work pool {pool!r} (process) with deployment {deployment_name(pool)!r}; concurrency "
                f"limit {GPU_LIMIT!r}: {slots}. Start one worker per device: race worker --pool {pool} --device cuda:N")
    return deployment_name(pool)


def serve_deployments(nightly: NightlyConfig, cron: str = NIGHTLY_CRON, limit: int | None = None,
                      pool: str = DEFAULT_POOL, gpu_slots: int | None = None) -> None:
    """Prepare the shard pool (`prepare_pool`), then register the manual and nightly deployments
    with the server and run their flow runs here until stopped.

    Prefect's runner stops (after pausing the deployments) when its polling for scheduled runs
    fails a few times in a row, i.e. after about a minute without the server. Then this waits for
    the server to answer and serves again (registering the deployments again, unpaused), so a
    server restart of any length is survived. The runner takes a while to stop, so the server may
    answer again by the time its error arrives: an error is raised only when the server answers and
    the error is not one of losing it (`server_loss`)."""
    from prefect import serve

    keep_watching_for_cancellation()
    prepare_pool(nightly.resources.pool or pool, gpu_slots)
    while True:
        try:
            serve(*map(runner_deployment, declared(nightly, cron)), limit=limit)
        except Exception as exc:  # noqa: BLE001 - re-raised unless the server is or was away
            lost = server_loss(exc)
            if api_answers() and lost is None:
                raise
            cause = f"{type(lost).__name__}: {lost}" if lost is not None else type(exc).__name__
            logger.warning(f"race serve: lost the Prefect server ({cause}); serving again once it answers")
        else:
            if api_answers():
                return  # stopped on purpose
            logger.warning("race serve: the runner stopped without the Prefect server; serving again once it answers")
        while not api_answers():
            time.sleep(5)
        logger.info("race serve: the Prefect server answers again; serving")


def server_loss(exc: BaseException) -> BaseException | None:
    """The error within `exc` (an exception group, or an error raised while handling another) that
    says the Prefect server went away, or None: a failed connection anywhere in it, or a Prefect
    service loop that gave up after its consecutive failures ("Service exceeded error threshold").
    The warning names it: the runner's own error is an exception group that says nothing."""
    import httpx

    seen: set[int] = set()
    todo: list[BaseException] = [exc]
    while todo:
        error = todo.pop()
        if id(error) in seen:
            continue
        seen.add(id(error))
        if isinstance(error, (httpx.TransportError, ConnectionError)) or (
                isinstance(error, RuntimeError) and "exceeded error threshold" in str(error)):
            return error
        todo.extend(getattr(error, "exceptions", ()))
        todo.extend(e for e in (error.__cause__, error.__context__) if e is not None)
    return None


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
