"""The Ray executor: a stage's units on Ray actors, one per device (docs/architecture.md §8 scale-out).

`--executor ray --ray-address ADDR` connects this process (the stage, inside its Prefect task: Prefect
still orchestrates the run) to the Ray cluster at ADDR (none: a Ray of this machine) and starts
`resources.ray_actors` actors (0: one per GPU of the cluster, each with `num_gpus=1`; on CPU one per
node, spread, each with the CPUs of the smallest node: `_placement`). Each actor rebuilds the job
from its kind and spec (`tasks.units.job_from_spec`: the installed package, the store URL, the model
as a checkpoint object of the store fetched once per host, into `RACE_CHECKPOINT_CACHE` or else
`race-cache/checkpoints` in the host's temporary folder) and keeps one worker, so its model stays
loaded across the units it is given. A unit reads only its own rows and commits its manifest
create-if-absent, as in one process.

Failures: a unit that raises is retried by Ray on its actor (`max_task_retries` with
`retry_exceptions`); an actor that dies (its node removed, its process killed) loses its unit, which
goes to a live actor, and a replacement actor is asked for (placed when the cluster has room). A
unit is tried MAX_ATTEMPTS times in all; then, or when no actor is left, the stage fails with
`UnitsFailed` (not retried by its task: tries are counted once).
"""

from __future__ import annotations

import logging
import os
import socket
import tempfile
import time
from collections import deque
from collections.abc import Callable
from typing import Any

from race_core.config import Resources
from storage import ArtifactStore
from tasks.executors import MAX_ATTEMPTS, UnitsFailed
from tasks.units import Unit, UnitJob

RAY_EXTRA = "pip install -e '.[ray]'"

logger = logging.getLogger(__name__)


def import_ray():
    """The `ray` module, or an ImportError naming the extra that installs it."""
    try:
        import ray
    except ImportError:
        raise ImportError(f"the ray executor needs Ray, which is not installed: {RAY_EXTRA}") from None
    return ray


class UnitActor:
    """One device's worker: the job rebuilt from its spec, one model kept across units."""

    def __init__(self, store: str, kind: str, spec: dict[str, Any], device: str):
        from storage import ArtifactStore
        from tasks.policy_ref import CACHE_ENV
        from tasks.units import job_from_spec

        # its worker's log lines as plain lines on the actor's stderr, which Ray shows on the driver's
        logging.basicConfig(format="%(message)s")
        for name in ("tasks", "race_core"):
            logging.getLogger(name).setLevel(logging.INFO)
        # an actor's folder is Ray's choice: the fetched model goes to one cache per host
        os.environ.setdefault(CACHE_ENV, os.path.join(tempfile.gettempdir(), "race-cache", "checkpoints"))
        self.job = job_from_spec(kind, spec)
        self.where = f"{socket.gethostname()}:{os.getpid()}"
        self.worker = self.job.worker(ArtifactStore(store), device)

    def ready(self) -> str:
        import ray

        return f"{self.where} (node {ray.get_runtime_context().get_node_id()})"

    def do(self, unit: Unit, force: bool) -> dict[str, Any]:
        return {**self.worker.run(unit, force), "worker": self.where}


def _cpu_nodes(ray: Any) -> list[int]:
    """The CPU counts of the cluster's live nodes that have any."""
    return [int(node["Resources"]["CPU"]) for node in ray.nodes()
            if node["Alive"] and node["Resources"].get("CPU", 0) >= 1]


def _placement(ray: Any, gpu: bool, wanted: int) -> tuple[int, dict[str, Any]]:
    """(actors, resources of one): `wanted` actors, or one per GPU (`num_gpus=1`); on CPU one per node,
    each with the CPUs of the smallest node (or an even share of them when more actors are wanted
    than nodes), so that it computes with the threads one process of its node would (CPU kernels'
    float sums depend on their thread count)."""
    if gpu:
        return wanted or int(ray.cluster_resources().get("GPU", 0)), {"num_gpus": 1}
    nodes = _cpu_nodes(ray)
    actors = wanted or len(nodes)
    return actors, {"num_cpus": max(1, min(min(nodes, default=1), sum(nodes) // max(actors, 1)))}


class RayExecutor:
    """Units on Ray actors (see the module docstring)."""

    def run(self, job: UnitJob, todo: list[Unit], store: ArtifactStore, resources: Resources, force: bool = False,
            on_progress: Callable[[Any], None] | None = None) -> None:
        ray = import_ray()
        if not ray.is_initialized():
            ray.init(address=resources.ray_address or None, log_to_driver=True)
        gpu = resources.device.startswith("cuda")
        actors, each = _placement(ray, gpu, resources.ray_actors)
        if actors < 1:
            raise UnitsFailed(f"{job.what}: the Ray cluster {resources.ray_address or '(this machine)'} has no "
                              f"{'GPU' if gpu else 'node with a CPU'} for an actor")
        remote = ray.remote(UnitActor).options(**each, scheduling_strategy="SPREAD", max_restarts=0)
        spec = job.portable(store).spec()

        def start() -> Any:
            return remote.remote(store.url, job.kind, spec, "cuda" if gpu else "cpu")

        _Dispatch(ray, job, force, start, resources.pickup_timeout).run(todo, actors)


class _Dispatch:
    """Gives units to idle actors, one at a time, until all are done."""

    def __init__(self, ray: Any, job: UnitJob, force: bool, start: Callable[[], Any], wait_s: float):
        self.ray, self.job, self.force, self.start, self.wait_s = ray, job, force, start, wait_s
        self.failed_start: str | None = None

    def run(self, todo: list[Unit], count: int) -> None:
        ray, job = self.ray, self.job
        everyone = [self.start() for _ in range(count)]
        starting = {actor.ready.remote(): actor for actor in everyone}
        idle: list[Any] = []
        running: dict[Any, tuple[Any, Unit, int]] = {}
        queue = deque((unit, 0) for unit in todo)
        done, began, heard = 0, time.monotonic(), time.monotonic()
        try:
            while queue or running:
                while queue and idle:
                    (unit, tries), actor = queue.popleft(), idle.pop()
                    ref = actor.do.options(max_task_retries=MAX_ATTEMPTS - 1 - tries, retry_exceptions=True).remote(
                        unit, self.force)
                    running[ref] = (actor, unit, tries + 1)
                if not running and not starting:
                    raise UnitsFailed(f"{job.what}: no Ray actor is left to do {job.noun} "
                                      f"{[job.index(u) for u, _ in queue]}"
                                      + (f"; the last one failed to start: {self.failed_start}" if self.failed_start
                                         else ""))
                ready, _ = ray.wait([*running, *starting], num_returns=1, timeout=self.wait_s)
                if not ready:
                    if not running and time.monotonic() - heard > self.wait_s:
                        raise UnitsFailed(f"{job.what}: no Ray actor could be placed in {round(self.wait_s)} s "
                                          "(resources.pickup_timeout): the cluster has no room for one")
                    continue
                heard = time.monotonic()
                ref = ready[0]
                if ref in starting:
                    actor = starting.pop(ref)
                    try:
                        logger.info(f"{job.what}: Ray actor ready on {ray.get(ref)}")
                        idle.append(actor)
                    except ray.exceptions.RayActorError as exc:
                        self.failed_start = f"{type(exc).__name__}: {str(exc)[-400:]}"
                        logger.warning(f"{job.what}: a Ray actor failed to start ({self.failed_start})")
                    continue
                actor, unit, tries = running.pop(ref)
                try:
                    counts = ray.get(ref)
                except ray.exceptions.RayActorError as exc:  # the actor (or its node) died
                    logger.warning(f"{job.what}: a Ray actor died doing {job.noun[:-1]} {job.index(unit)} "
                                   f"({type(exc).__name__}); it goes again")
                    self.again(queue, unit, tries, exc)
                    everyone.append(replacement := self.start())
                    starting[replacement.ready.remote()] = replacement
                    continue
                except ray.exceptions.RayTaskError as exc:  # Ray's own retries are spent
                    raise UnitsFailed(f"{job.what}: {job.noun[:-1]} {job.index(unit)} failed {MAX_ATTEMPTS} times on "
                                      f"Ray: {exc.cause!r}") from exc.cause
                idle.append(actor)
                done += 1
                outcome = "skipped" if counts["skipped"] else "committed" if counts["committed"] else "dropped"
                logger.info(f"{job.what}: {job.noun[:-1]} {job.index(unit)} {outcome} by {counts['worker']} "
                            f"({counts['read_bytes']} bytes read); {done} of {len(todo)} done on Ray after "
                            f"{round(time.monotonic() - began)} s")
        finally:
            for actor in everyone:
                ray.kill(actor)

    def again(self, queue: deque, unit: Unit, tries: int, cause: Exception) -> None:
        if tries >= MAX_ATTEMPTS:
            raise UnitsFailed(f"{self.job.what}: {self.job.noun[:-1]} {self.job.index(unit)} was lost with its Ray "
                              f"actor {MAX_ATTEMPTS} times") from cause
        queue.append((unit, tries))
