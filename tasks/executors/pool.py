"""The pool executor: a stage's units as child flow runs on a Prefect work pool (docs/architecture.md §8 scale-out).

`PoolExecutor.run` (the parent: a cover or sample stage whose resources name the pool) cuts the
units into groups (`UnitJob.units_per_process`: `resources.pool_shards` for the cover, else one) and
submits each group as a child flow run of `race-units/<pool>` (`flows.shard`, deployed by `race
serve`), which a `race worker` of the pool runs on its device. The child rebuilds the job from its
kind and spec (`tasks.units.job_from_spec`): the installed package, the store URL and digests, no
path of the parent's host; the model is a checkpoint object of the store, fetched once per worker
host into its cache. Each unit reads only its own rows and commits its manifest to the store; the
parent watches until every unit is committed, then its stage merges them.

Watching: the parent reads its pending children's states in pages (`page_size()` runs per request,
PREFECT_API_DEFAULT_LIMIT: the server answers at most that many at once). A child run still Scheduled or Late is waiting for a
free worker, which is not silence, as long as the pool has a worker online (busy with other runs'
children, say); but when for `resources.pickup_timeout` seconds none of the stage's children has
been taken and no worker of the pool is online, the waiting ones are cancelled and the stage fails
saying that no worker took them (`UnitsFailed`).

A worker that dies takes its child run with it, and Prefect still shows that run as running. So
the child keeps a lease: `leases/<flow run id>.json` in the store, rewritten every
LEASE_INTERVAL_S with a beat counter and the child's progress figures. The parent times the lease
with its own clock (no clocks compared across hosts): a child run pending or running whose lease
has not changed for `resources.lease_timeout` seconds is marked Crashed and its uncommitted units
are submitted again, like those of a child run that failed or crashed. A group is tried
MAX_ATTEMPTS times; then the stage fails with `UnitsFailed`, which its task does not retry (the
tries are counted here, once). Should the silent worker come back and finish anyway, its manifests
are written create-if-absent: one copy wins, the other is dropped.

The cover's progress on the pool is the children's: each lease carries its child's
`ProgressFigures`, and the parent adds them up (`race_core.progress.combine_figures`) into the same
bar, log lines and Prefect progress artifact as a one-process cover.

Leases: a child removes its own when it ends, the parent the lease of a child it saw end or took for
dead; one left by a child and a parent that both died is litter that `race gc` removes once older
than its grace period (a live lease is rewritten every 2 s, so it is never that old).
"""

from __future__ import annotations

import logging
import os
import socket
import threading
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Any
from uuid import UUID

from race_core.config import Resources
from race_core.progress import ProgressFigures, combine_figures
from storage import ArtifactStore
from tasks.executors import MAX_ATTEMPTS, UnitsFailed
from tasks.units import Unit, UnitJob

logger = logging.getLogger(__name__)

UNITS_FLOW = "race-units"
LEASE_INTERVAL_S = 2.0
POLL_S = 2.0
def page_size() -> int:
    """Flow runs per read: the server's largest page, PREFECT_API_DEFAULT_LIMIT (200 unless set;
    the client reads the same setting)."""
    from prefect.settings import PREFECT_API_DEFAULT_LIMIT

    return int(PREFECT_API_DEFAULT_LIMIT.value())


def deployment_name(pool: str) -> str:
    """The child flow's deployment on a pool: `race-units/<pool>` (`race serve` deploys it)."""
    return f"{UNITS_FLOW}/{pool}"


def lease_record(flow_run_id: str) -> str:
    return f"leases/{flow_run_id}.json"


class Lease:
    """The child's side: rewrite the lease every `interval` s until the block ends (a thread)."""

    def __init__(self, store: ArtifactStore, flow_run_id: str, device: str, interval: float = LEASE_INTERVAL_S):
        self.store, self.flow_run_id, self.interval = store, flow_run_id, interval
        self.holder = {"flow_run_id": flow_run_id, "host": socket.gethostname(), "pid": os.getpid(),
                       "device": device}
        self.beat = 0
        self.progress: dict[str, Any] | None = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="race-lease", daemon=True)

    def renew(self) -> None:
        self.beat += 1
        self.store.write_record(lease_record(self.flow_run_id),
                                {**self.holder, "beat": self.beat, "progress": self.progress})

    def report(self, figures: ProgressFigures) -> None:
        """Carry the child's progress in its next beats (the parent adds the children's up)."""
        self.progress = asdict(figures)

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            try:
                self.renew()
            except Exception:  # noqa: BLE001 - a missed beat is retried; a long outage reads as death
                pass

    def __enter__(self) -> Lease:
        self.renew()
        self._thread.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self._stop.set()
        self._thread.join()
        _forget_lease(self.store, self.flow_run_id)


@dataclass
class _Group:
    units: list[Unit]
    size: int = 0  # trajectories, for progress
    attempts: int = 0
    run_id: UUID | None = None
    heard_at: float = field(default_factory=time.monotonic)  # the parent's clock
    lease: dict[str, Any] | None = None
    figures: ProgressFigures | None = None  # the child's progress, from its lease
    state: str = ""
    waiting: bool = True  # scheduled or late: no worker has taken it yet


class PoolExecutor:
    """Units as child flow runs on the Prefect work pool `resources.pool` (see the module docstring)."""

    def run(self, job: UnitJob, todo: list[Unit], store: ArtifactStore, resources: Resources, force: bool = False,
            on_progress: Callable[[ProgressFigures], None] | None = None) -> None:
        if not resources.pool:
            raise ValueError("parameter 'resources.pool': the pool executor needs a work pool (--pool NAME)")
        _check_deployment(resources.pool)
        portable = job.portable(store)
        per_run = job.units_per_process(resources)
        shared = {"store": store.url, "kind": job.kind, "spec": portable.spec(), "force": force}
        _Watch(job, store, resources, shared, force, on_progress).run(
            [_Group(todo[i:i + per_run]) for i in range(0, len(todo), max(per_run, 1))])


def _check_deployment(pool: str) -> None:
    from prefect.client.orchestration import get_client

    name = deployment_name(pool)
    with get_client(sync_client=True) as client:
        try:
            client.read_deployment_by_name(name)
        except Exception as exc:  # noqa: BLE001 - ObjectNotFound, or no server at all
            raise ValueError(f"parameter 'resources.pool': no deployment {name!r} on the Prefect server "
                             f"({type(exc).__name__}); `race serve` deploys it, then start `race worker --pool "
                             f"{pool} --device cuda:N` per device") from None


class _Watch:
    """The parent's side of one stage's child runs: submit, watch, resubmit, give up."""

    def __init__(self, job: UnitJob, store: ArtifactStore, resources: Resources, shared: dict[str, Any], force: bool,
                 on_progress: Callable[[ProgressFigures], None] | None):
        self.job, self.store, self.resources, self.shared = job, store, resources, shared
        self.force, self.on_progress = force, on_progress
        self.pool = resources.pool
        self.name = deployment_name(resources.pool)

    def submit(self, group: _Group) -> None:
        from prefect.deployments import run_deployment

        job = self.job
        group.units = [u for u in group.units if self.force or job.committed(self.store, u) is None]
        if not group.units:
            return  # done: its last figures stand for it
        group.figures = None  # a new child run starts from nothing
        group.attempts += 1
        indices = [job.index(u) for u in group.units]
        if group.attempts > MAX_ATTEMPTS:
            raise UnitsFailed(f"{job.what}: {job.noun} {indices} failed on pool {self.pool!r} {MAX_ATTEMPTS} times "
                              f"(last child run {group.run_id}: {group.state}); see that run's logs")
        span = f"{indices[0]}-{indices[-1]}" if len(indices) > 1 else f"{indices[0]}"
        run = run_deployment(self.name, timeout=0, flow_run_name=f"{job.what} {job.noun} {span}",
                             parameters={**self.shared, "units": group.units})
        group.run_id, group.heard_at, group.lease, group.state, group.waiting = (
            run.id, time.monotonic(), None, "SCHEDULED", True)
        logger.info(f"{job.what}: {job.noun} {span} submitted to pool {self.pool!r} as flow run {run.id}"
                    + (f" (attempt {group.attempts})" if group.attempts > 1 else ""))

    def run(self, groups: list[_Group]) -> None:
        from prefect.client.orchestration import get_client

        for group in groups:
            group.size = sum(map(self.job.size, group.units))
            self.submit(group)
        pending = [g for g in groups if g.units]
        started = taken = said = time.monotonic()
        shown = None
        while pending:
            time.sleep(POLL_S)
            with get_client(sync_client=True) as client:
                states = read_states(client, [g.run_id for g in pending])
                ended = False
                for group in list(pending):
                    self.watch(client, group, states.get(group.run_id))
                    if not group.units:
                        pending.remove(group)
                        ended = True
                if ended or not all(g.waiting for g in pending) or self.workers_online(client):
                    taken = time.monotonic()
                elif pending and time.monotonic() - taken > self.resources.pickup_timeout:
                    self.give_up(client, pending, time.monotonic() - taken)
            figures = combine_figures([(g.figures, g.size, not g.units) for g in groups], time.monotonic() - started)
            if figures is not None and figures != shown and self.on_progress is not None:
                self.on_progress(figures)
            shown = figures or shown
            if ended or time.monotonic() - said >= 30:  # a plain line when a child run ends, else every 30 s
                said = time.monotonic()
                logger.info(f"{self.job.what}: {len(groups) - len(pending)} of {len(groups)} child run(s) done on "
                            f"pool {self.pool!r} after {round(said - started)} s"
                            + (f"; {figures.summary()}" if figures is not None else ""))

    def workers_online(self, client: Any) -> bool:
        """Whether the pool has a worker that the server hears from (busy with other runs' children, say)."""
        from prefect.client.schemas.filters import WorkerFilter, WorkerFilterStatus

        return bool(client.read_workers_for_work_pool(
            self.pool, worker_filter=WorkerFilter(status=WorkerFilterStatus(any_=["ONLINE"])), limit=1))

    def give_up(self, client: Any, waiting: list[_Group], idle_s: float) -> None:
        """No worker took a child run for `pickup_timeout`: cancel the waiting ones and fail."""
        from prefect.states import Cancelled

        for group in waiting:
            try:
                client.set_flow_run_state(group.run_id, Cancelled(message="no worker took it"), force=True)
            except Exception:  # noqa: BLE001 - the error below is what matters
                pass
        raise UnitsFailed(f"{self.job.what}: no worker of pool {self.pool!r} took any of {len(waiting)} waiting child "
                          f"run(s) in {round(idle_s)} s (resources.pickup_timeout), and none is online: start "
                          f"`race worker --pool {self.pool} --device DEVICE` on a host that reaches the Prefect "
                          "server and the store")

    def watch(self, client: Any, group: _Group, state: Any) -> None:
        """One look at a group's child run: resubmit what a failed, crashed, lost or silent run left
        undone; read its lease (liveness, progress)."""
        from prefect.states import Crashed

        job, store = self.job, self.store
        if state is None:  # the run is gone from the server (deleted): its units go again
            group.state = "not found on the server"
            self.submit(group)
            return
        group.state = f"{state.name}: {state.message}" if state.message else state.name
        if state.is_final():
            group.waiting = False
            _forget_lease(store, group.run_id)
            if state.is_completed() and not self.force:
                self.submit(group)  # a completed run committed its units: nothing left to submit
            elif state.is_completed():
                group.units = []
            else:
                logger.warning(f"{job.what}: child run {group.run_id} ended {group.state}: its {job.noun} go again")
                self.submit(group)
        elif state.is_running() or state.is_pending():
            group.waiting = False
            try:
                lease = store.read_record(lease_record(str(group.run_id)))
            except FileNotFoundError:  # the child ended and removed it between the look and the read
                lease = None
            if lease != group.lease:
                group.lease, group.heard_at = lease, time.monotonic()
                if lease and lease.get("progress"):
                    group.figures = ProgressFigures(**lease["progress"])
            elif time.monotonic() - group.heard_at > self.resources.lease_timeout:
                silent = round(time.monotonic() - group.heard_at)
                where = f" on {lease['host']} ({lease['device']})" if lease else ""
                logger.warning(f"{job.what}: child run {group.run_id}{where} silent for {silent} s: its worker is "
                               f"taken for dead; its {job.noun} go again")
                client.set_flow_run_state(group.run_id, Crashed(
                    message=f"lease silent for {silent} s (race {job.what}): {job.noun} submitted again"), force=True)
                group.state = f"silent for {silent} s"
                _forget_lease(store, group.run_id)
                self.submit(group)
        else:  # scheduled or late: waiting for a free worker is not silence
            group.waiting, group.heard_at = True, time.monotonic()


def read_states(client: Any, run_ids: list[UUID]) -> dict[UUID, Any]:
    """The states of the flow runs `run_ids`, read a page (`page_size`) at a time."""
    from prefect.client.schemas.filters import FlowRunFilter, FlowRunFilterId

    states: dict[UUID, Any] = {}
    size = page_size()
    for at in range(0, len(run_ids), size):
        page = run_ids[at:at + size]
        for run in client.read_flow_runs(flow_run_filter=FlowRunFilter(id=FlowRunFilterId(any_=page)), limit=size):
            states[run.id] = run.state
    return states


def _forget_lease(store: ArtifactStore, flow_run_id: UUID | None) -> None:
    try:
        store.fs.rm(f"{store.root}/{lease_record(str(flow_run_id))}")
    except (FileNotFoundError, OSError):
        pass
