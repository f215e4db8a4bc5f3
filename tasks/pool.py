"""The cover's shards spread over a Prefect work pool (DESIGN §8 scale-out).

`score_on_pool` (the parent: the cover stage when `resources.pool` names a pool) cuts the shards to
score into groups of `resources.pool_shards` and submits each group as a child flow run of the
`race-score-shard/<pool>` deployment (`flows.shard`, deployed by `race serve`), which a `race
worker` of the pool runs on its device; the child commits the group's shard manifests to the store
(an object store URL every worker reaches). The parent watches until every shard is committed,
then the cover merges them (`tasks.shards.merge_shards`).

A worker that dies takes its child run with it, and Prefect still shows that run as running. So
the child keeps a lease: `leases/<flow run id>.json` in the store, rewritten every
LEASE_INTERVAL_S with a beat counter. The parent times the lease with its own clock (no clocks
compared across hosts): a child run pending or running whose lease has not changed for
`resources.lease_timeout` seconds is marked Crashed and its uncommitted shards are submitted
again, like those of a child run that failed or crashed. A group is tried MAX_ATTEMPTS times.
Should the silent worker come back and finish anyway, its shard manifests are written
create-if-absent: one copy wins, the other is dropped.
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

from race_core.config import CoverConfig, Resources
from storage import ArtifactStore
from tasks.shards import Shard, committed, shard_key

SHARD_FLOW = "race-score-shard"
LEASE_INTERVAL_S = 2.0
POLL_S = 2.0
MAX_ATTEMPTS = 3
Log = Callable[[str], None]


def deployment_name(pool: str) -> str:
    """The shard deployment of a pool: `race-score-shard/<pool>` (`race serve` deploys it)."""
    return f"{SHARD_FLOW}/{pool}"


def lease_record(flow_run_id: str) -> str:
    return f"leases/{flow_run_id}.json"


class Lease:
    """The child's side: rewrite the lease every `interval` s until the block ends (a thread)."""

    def __init__(self, store: ArtifactStore, flow_run_id: str, device: str, interval: float = LEASE_INTERVAL_S):
        self.store, self.flow_run_id, self.interval = store, flow_run_id, interval
        self.holder = {"flow_run_id": flow_run_id, "host": socket.gethostname(), "pid": os.getpid(),
                       "device": device}
        self.beat = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="race-lease", daemon=True)

    def renew(self) -> None:
        self.beat += 1
        self.store.write_record(lease_record(self.flow_run_id), {**self.holder, "beat": self.beat})

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


@dataclass
class _Group:
    shards: list[Shard]
    attempts: int = 0
    run_id: UUID | None = None
    heard_at: float = field(default_factory=time.monotonic)  # the parent's clock
    lease: dict[str, Any] | None = None
    state: str = ""


def score_on_pool(store: ArtifactStore, trajectories_digest: str, checkpoint: str, model_digest: str,
                  config: CoverConfig, resources: Resources, scope: str, todo: list[Shard], log: Log,
                  force: bool = False) -> None:
    """Score `todo` on the pool's workers; returns when every shard of it is committed."""
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import FlowRunFilter, FlowRunFilterId
    from prefect.deployments import run_deployment
    from prefect.states import Crashed

    name = deployment_name(resources.pool)
    with get_client(sync_client=True) as client:
        try:
            client.read_deployment_by_name(name)
        except Exception as exc:  # noqa: BLE001 - ObjectNotFound, or no server at all
            raise ValueError(f"parameter 'resources.pool': no deployment {name!r} on the Prefect server "
                             f"({type(exc).__name__}); `race serve` deploys it, then start `race worker --pool "
                             f"{resources.pool} --device cuda:N` per device") from None
    child_resources = asdict(replace(resources, pool=""))
    groups = [_Group(todo[i:i + resources.pool_shards]) for i in range(0, len(todo), resources.pool_shards)]

    def submit(group: _Group) -> None:
        group.shards = [s for s in group.shards if force or committed(store, shard_key(scope, s)) is None]
        if not group.shards:
            return
        group.attempts += 1
        if group.attempts > MAX_ATTEMPTS:
            raise RuntimeError(f"cover: shards {[s.index for s in group.shards]} failed on pool "
                               f"{resources.pool!r} {MAX_ATTEMPTS} times (last child run {group.run_id}: "
                               f"{group.state}); see that run's logs")
        first, last = group.shards[0].index, group.shards[-1].index
        run = run_deployment(name, timeout=0, flow_run_name=f"cover shards {first}-{last}", parameters={
            "store": store.url, "trajectories": trajectories_digest, "checkpoint": checkpoint,
            "model_digest": model_digest, "scope": scope, "config": asdict(config), "resources": child_resources,
            "shards": [{"index": s.index, "ids": list(s.ids)} for s in group.shards], "force": force})
        group.run_id, group.heard_at, group.lease, group.state = run.id, time.monotonic(), None, "SCHEDULED"
        log(f"cover: shards {first}-{last} submitted to pool {resources.pool!r} as flow run {run.id}"
            + (f" (attempt {group.attempts})" if group.attempts > 1 else ""))

    for group in groups:
        submit(group)
    pending = [g for g in groups if g.shards]
    started, said = time.monotonic(), 0.0
    while pending:
        time.sleep(POLL_S)
        with get_client(sync_client=True) as client:
            runs = {r.id: r for r in client.read_flow_runs(
                flow_run_filter=FlowRunFilter(id=FlowRunFilterId(any_=[g.run_id for g in pending])))}
            for group in list(pending):
                state = runs[group.run_id].state
                group.state = f"{state.name}: {state.message}" if state.message else state.name
                if state.is_final():
                    _forget_lease(store, group.run_id)
                    if state.is_completed() and not force:
                        submit(group)  # a completed run committed its shards: nothing left to submit
                    elif state.is_completed():
                        group.shards = []
                    else:
                        log(f"cover: child run {group.run_id} ended {group.state}: its shards go again")
                        submit(group)
                elif state.is_running() or state.is_pending():
                    lease = store.read_record(lease_record(str(group.run_id)))
                    if lease != group.lease:
                        group.lease, group.heard_at = lease, time.monotonic()
                    elif time.monotonic() - group.heard_at > resources.lease_timeout:
                        silent = round(time.monotonic() - group.heard_at)
                        where = f" on {lease['host']} ({lease['device']})" if lease else ""
                        log(f"cover: child run {group.run_id}{where} silent for {silent} s: its worker is taken "
                            "for dead; its shards go again")
                        client.set_flow_run_state(group.run_id, Crashed(
                            message=f"lease silent for {silent} s (race cover): shards submitted again"), force=True)
                        group.state = f"silent for {silent} s"
                        _forget_lease(store, group.run_id)
                        submit(group)
                else:  # scheduled or late: waiting for a free worker is not silence
                    group.heard_at = time.monotonic()
                if not group.shards:
                    pending.remove(group)
        if time.monotonic() - said >= 30:
            said = time.monotonic()
            log(f"cover: {sum(len(g.shards) for g in pending)} shard(s) in {len(pending)} child run(s) still "
                f"on pool {resources.pool!r} after {round(said - started)} s")


def _forget_lease(store: ArtifactStore, flow_run_id: UUID | None) -> None:
    try:
        store.fs.rm(f"{store.root}/{lease_record(str(flow_run_id))}")
    except (FileNotFoundError, OSError):
        pass
