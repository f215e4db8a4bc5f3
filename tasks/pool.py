"""The cover's shards and the sample stage's chunks spread over a Prefect work pool (DESIGN §8 scale-out).

`run_on_pool` (the parent: the cover stage, or the sample stage, when `resources.pool` names a pool)
cuts the units to do into groups and submits each group as a child flow run of a deployment on the
pool (`race-score-shard/<pool>`: `resources.pool_shards` shards per run; `race-sample-chunk/<pool>`:
one chunk per run; both in `flows.shard`, deployed by `race serve`), which a `race worker` of the
pool runs on its device; the child commits its units' manifests to the store (an object store URL
every worker reaches). The parent watches until every unit is committed, then its stage merges them
(`tasks.shards.merge_shards`, `tasks.chunks.merge_chunks`).

A worker that dies takes its child run with it, and Prefect still shows that run as running. So
the child keeps a lease: `leases/<flow run id>.json` in the store, rewritten every
LEASE_INTERVAL_S with a beat counter and the child's progress figures. The parent times the lease
with its own clock (no clocks compared across hosts): a child run pending or running whose lease
has not changed for `resources.lease_timeout` seconds is marked Crashed and its uncommitted units
are submitted again, like those of a child run that failed or crashed. A group is tried
MAX_ATTEMPTS times. Should the silent worker come back and finish anyway, its manifests are written
create-if-absent: one copy wins, the other is dropped.

The cover's progress on the pool is the children's: each lease carries its child's
`ProgressFigures`, and the parent adds them up (`race_core.progress.combine_figures`) into the same
bar, log lines and Prefect progress artifact as a one-process cover.

Leases: a child removes its own when it ends, the parent the lease of a child it saw end or took for
dead; one left by a child and a parent that both died is litter that `race gc` removes once older
than its grace period (a live lease is rewritten every 2 s, so it is never that old).
"""

from __future__ import annotations

import os
import socket
import threading
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field, replace
from typing import Any
from uuid import UUID

from race_core.config import CoverConfig, Resources, RLConfig
from race_core.progress import ProgressFigures, combine_figures
from storage import ArtifactStore
from tasks.shards import Shard, committed, shard_key

SHARD_FLOW = "race-score-shard"
SAMPLE_FLOW = "race-sample-chunk"
POOL_FLOWS = (SHARD_FLOW, SAMPLE_FLOW)
LEASE_INTERVAL_S = 2.0
POLL_S = 2.0
MAX_ATTEMPTS = 3
Log = Callable[[str], None]


def deployment_name(pool: str, flow: str = SHARD_FLOW) -> str:
    """A child flow's deployment on a pool: `<flow>/<pool>` (`race serve` deploys them)."""
    return f"{flow}/{pool}"


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


@dataclass(frozen=True)
class PoolWork:
    """One kind of unit the pool's workers do: the child flow, what to call the units in logs, when
    one is done, the child run's parameters for a group of them and, for progress, a unit's size."""

    flow: str  # SHARD_FLOW or SAMPLE_FLOW
    what: str  # "cover" or "sample": the log lines' prefix
    noun: str  # "shards", "chunks"
    done: Callable[[Any], bool]  # a unit committed (its manifest usable)
    parameters: Callable[[list[Any]], dict[str, Any]]  # a group's child run parameters (store, resources, force added)
    index: Callable[[Any], int] = lambda unit: unit
    size: Callable[[Any], int] = lambda unit: 1  # trajectories of a unit (progress)


@dataclass
class _Group:
    units: list[Any]
    size: int = 0  # trajectories, for progress
    attempts: int = 0
    run_id: UUID | None = None
    heard_at: float = field(default_factory=time.monotonic)  # the parent's clock
    lease: dict[str, Any] | None = None
    figures: ProgressFigures | None = None  # the child's progress, from its lease
    state: str = ""


def score_on_pool(store: ArtifactStore, trajectories_digest: str, checkpoint: str, model_digest: str,
                  config: CoverConfig, resources: Resources, scope: str, todo: list[Shard], log: Log,
                  force: bool = False, on_progress: Callable[[ProgressFigures], None] | None = None) -> None:
    """Score the cover's shards `todo` on the pool's workers; returns when every one is committed."""
    work = PoolWork(
        SHARD_FLOW, "cover", "shards", lambda s: committed(store, shard_key(scope, s)) is not None,
        lambda group: {"trajectories": trajectories_digest, "checkpoint": checkpoint, "model_digest": model_digest,
                       "scope": scope, "config": asdict(config),
                       "shards": [{"index": s.index, "ids": list(s.ids)} for s in group]},
        index=lambda s: s.index, size=lambda s: len(s.ids))
    run_on_pool(store, resources, work, todo, resources.pool_shards, log, force, on_progress)


def sample_on_pool(store: ArtifactStore, policy: Any, config: RLConfig, resources: Resources, iteration: int,
                   scope: str, todo: list[int], log: Log, force: bool = False) -> None:
    """Play the sample stage's chunks `todo` on the pool's workers, one child run each."""
    from tasks.chunks import chunk_committed

    work = PoolWork(
        SAMPLE_FLOW, "sample", "chunks", lambda c: chunk_committed(store, scope, c) is not None,
        lambda group: {"policy": asdict(policy), "config": asdict(config), "iteration": iteration, "scope": scope,
                       "chunks": group})
    run_on_pool(store, resources, work, todo, 1, log, force)


def run_on_pool(store: ArtifactStore, resources: Resources, work: PoolWork, todo: list[Any], per_run: int,
                log: Log, force: bool = False, on_progress: Callable[[ProgressFigures], None] | None = None) -> None:
    """Do the units `todo` as child flow runs of `work.flow` on `resources.pool`, `per_run` units
    each; returns when every unit is committed (see the module docstring)."""
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import FlowRunFilter, FlowRunFilterId
    from prefect.deployments import run_deployment

    name = deployment_name(resources.pool, work.flow)
    with get_client(sync_client=True) as client:
        try:
            client.read_deployment_by_name(name)
        except Exception as exc:  # noqa: BLE001 - ObjectNotFound, or no server at all
            raise ValueError(f"parameter 'resources.pool': no deployment {name!r} on the Prefect server "
                             f"({type(exc).__name__}); `race serve` deploys it, then start `race worker --pool "
                             f"{resources.pool} --device cuda:N` per device") from None
    shared = {"store": store.url, "resources": asdict(replace(resources, pool="")), "force": force}
    groups = [_Group(todo[i:i + per_run]) for i in range(0, len(todo), max(per_run, 1))]
    for group in groups:
        group.size = sum(map(work.size, group.units))

    def submit(group: _Group) -> None:
        group.units = [u for u in group.units if force or not work.done(u)]
        if not group.units:
            return  # done: its last figures stand for it
        group.figures = None  # a new child run starts from nothing
        group.attempts += 1
        indices = [work.index(u) for u in group.units]
        if group.attempts > MAX_ATTEMPTS:
            raise RuntimeError(f"{work.what}: {work.noun} {indices} failed on pool {resources.pool!r} {MAX_ATTEMPTS} "
                               f"times (last child run {group.run_id}: {group.state}); see that run's logs")
        span = f"{indices[0]}-{indices[-1]}" if len(indices) > 1 else f"{indices[0]}"
        run = run_deployment(name, timeout=0, flow_run_name=f"{work.what} {work.noun} {span}",
                             parameters={**shared, **work.parameters(group.units)})
        group.run_id, group.heard_at, group.lease, group.state = run.id, time.monotonic(), None, "SCHEDULED"
        log(f"{work.what}: {work.noun} {span} submitted to pool {resources.pool!r} as flow run {run.id}"
            + (f" (attempt {group.attempts})" if group.attempts > 1 else ""))

    for group in groups:
        submit(group)
    pending = [g for g in groups if g.units]
    started, said, shown = time.monotonic(), 0.0, None
    while pending:
        time.sleep(POLL_S)
        with get_client(sync_client=True) as client:
            runs = {r.id: r for r in client.read_flow_runs(
                flow_run_filter=FlowRunFilter(id=FlowRunFilterId(any_=[g.run_id for g in pending])))}
            ended = False
            for group in list(pending):
                _watch(store, client, work, group, runs[group.run_id].state, resources, submit, force, log)
                if not group.units:
                    pending.remove(group)
                    ended = True
        figures = combine_figures([(g.figures, g.size, not g.units) for g in groups], time.monotonic() - started)
        if figures is not None and figures != shown and on_progress is not None:
            on_progress(figures)
        shown = figures or shown
        if ended or time.monotonic() - said >= 30:  # a plain line when a child run ends, else every 30 s
            said = time.monotonic()
            log(f"{work.what}: {len(groups) - len(pending)} of {len(groups)} child run(s) done on pool "
                f"{resources.pool!r} after {round(said - started)} s"
                + (f"; {figures.summary()}" if figures is not None else ""))


def _watch(store: ArtifactStore, client: Any, work: PoolWork, group: _Group, state: Any, resources: Resources,
           submit: Callable[[_Group], None], force: bool, log: Log) -> None:
    """One look at a group's child run: resubmit what a failed, crashed or silent run left undone;
    read its lease (liveness, progress)."""
    from prefect.states import Crashed

    group.state = f"{state.name}: {state.message}" if state.message else state.name
    if state.is_final():
        _forget_lease(store, group.run_id)
        if state.is_completed() and not force:
            submit(group)  # a completed run committed its units: nothing left to submit
        elif state.is_completed():
            group.units = []
        else:
            log(f"{work.what}: child run {group.run_id} ended {group.state}: its {work.noun} go again")
            submit(group)
    elif state.is_running() or state.is_pending():
        lease = store.read_record(lease_record(str(group.run_id)))
        if lease != group.lease:
            group.lease, group.heard_at = lease, time.monotonic()
            if lease and lease.get("progress"):
                group.figures = ProgressFigures(**lease["progress"])
        elif time.monotonic() - group.heard_at > resources.lease_timeout:
            silent = round(time.monotonic() - group.heard_at)
            where = f" on {lease['host']} ({lease['device']})" if lease else ""
            log(f"{work.what}: child run {group.run_id}{where} silent for {silent} s: its worker is taken "
                f"for dead; its {work.noun} go again")
            client.set_flow_run_state(group.run_id, Crashed(
                message=f"lease silent for {silent} s (race {work.what}): {work.noun} submitted again"), force=True)
            group.state = f"silent for {silent} s"
            _forget_lease(store, group.run_id)
            submit(group)
    else:  # scheduled or late: waiting for a free worker is not silence
        group.heard_at = time.monotonic()


def _forget_lease(store: ArtifactStore, flow_run_id: UUID | None) -> None:
    try:
        store.fs.rm(f"{store.root}/{lease_record(str(flow_run_id))}")
    except (FileNotFoundError, OSError):
        pass
