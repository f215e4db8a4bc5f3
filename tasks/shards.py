"""The cover stage's unit of work: the shard (docs/architecture.md §7, §8 scale-out).

The cover's input is cut, in its stored order, every `resources.shard_size` trajectories. A shard is
named by what it holds, not where it sits: its key is `<scope>-<sha256 of its trajectory ids>`,
where the scope is the stage key of everything else the decisions depend on (cover config and
dtype, model digest, the cover's code fingerprint and library versions), and a trajectory id is
the hash of its content. Each scored shard commits `decisions` and `rejects` objects plus a
manifest `stages/cover-shard/<key>.json`, written create-if-absent: a second writer of the same
shard (a unit submitted again after its worker went silent, a second process on the same store)
finds it present and drops its own copy, so no shard is ever scored twice into the result.

`CoverJob` is the cover's `tasks.units.UnitJob`: a unit is one shard ({index, start, ids, reuse}),
and a worker reads only that shard's rows of the trajectories object (the Parquet row groups that
hold them, by ranged reads: `tasks.rows.read_rows`), checks each row's id against its content and the plan,
scores and commits it. The stage output (`decisions`, `rejects`, what `compress` and `race cover`
read) is the shards' rows concatenated in input order, whatever ran where: the same rows, in the
same order, as one process scoring shard after shard. A run that stops (killed, out of memory,
failed) leaves its finished shards committed; the next one resumes at the first shard without a
manifest.

Shard size changed: the new shards have new keys, but a trajectory already decided in a committed
shard of the same scope is not scored again: its decision and reject rows are copied from that
shard (each trajectory's decisions do not depend on its shard-mates, docs/architecture.md §4), and only the rest
is scored. The stage finds the committed shards of other sizes once, by listing the scope's
manifests (only when some shard of the plan is missing), and gives each unit the ones it copies from.
"""

from __future__ import annotations

import hashlib
import logging
import os
import tempfile
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field, replace
from typing import Any

from race_core.config import CoverConfig, Resources, from_dict
from race_core.schema import Trajectory, trajectory_id
from race_core.scoring import sum_work
from storage import ArtifactStore, stage_key
from storage.parquet import DatasetWriter, iter_rows_from_store, read_dataset_from_store, row_to_trajectory
from tasks.base import TempDataset
from tasks.cover_scoring import ShardScorer, can_shrink, cover_key_config, cover_scorer, shrunk
from tasks.fingerprints import stage_code
from tasks.policy_ref import PolicyRef
from tasks.rows import read_rows
from tasks.units import (
    Unit,
    UnitJob,
    UnitWorker,
    check_same_scope,
    commit_record,
    unit_provenance,
    usable,
)

logger = logging.getLogger(__name__)

SHARD_STAGE = "cover-shard"
SHARD_VERSION = 1


@dataclass(frozen=True)
class Shard:
    """`ids` of the trajectories at positions [index * size, index * size + len(ids)) of the input."""

    index: int
    ids: tuple[str, ...]

    @property
    def ids_digest(self) -> str:
        return hashlib.sha256("\n".join(self.ids).encode()).hexdigest()


def shard_scope(config: CoverConfig, resources: Resources, model_digest: str) -> str:
    """What a shard's decisions depend on besides its trajectories: the cover's key without its input."""
    keyed = cover_key_config(config, resources)
    return stage_key(SHARD_STAGE, SHARD_VERSION, keyed, {}, model_digest, stage_code("cover", keyed))


def shard_key(scope: str, shard: Shard) -> str:
    return f"{scope}-{shard.ids_digest}"


def manifest_record(key: str) -> str:
    return f"stages/{SHARD_STAGE}/{key}.json"


def plan_shards(store: ArtifactStore, trajectories_digest: str, shard_size: int) -> list[Shard]:
    """The shards of the input, in order (only the id column is read)."""
    if shard_size < 1:
        raise ValueError(f"parameter 'resources.shard_size': {shard_size} is not a positive number")
    ids = read_dataset_from_store(store, trajectories_digest, "trajectories", as_arrow=True, columns=["id"])
    ids = ids.column("id").to_pylist()
    return [Shard(i, tuple(ids[at:at + shard_size])) for i, at in enumerate(range(0, len(ids), shard_size))]


def committed(store: ArtifactStore, key: str) -> dict[str, Any] | None:
    """The shard's manifest if it is committed and its objects are all there, else None."""
    return usable(store, manifest_record(key))


# -- reading one shard's rows --------------------------------------------------------------------
def read_shard(store: ArtifactStore, digest: str, unit: Unit) -> tuple[list[Trajectory], int]:
    """The trajectories of one shard unit, each checked: its id is the hash of its content and the
    one the plan holds at its place. A row that fails the check sends the whole object through the
    store's verified read: a corrupt object is quarantined and named (`CorruptObjectError`), an intact
    one means the input is not the planned one."""
    planned = list(unit["ids"])
    try:
        rows, read = read_rows(store, digest, unit["start"], unit["start"] + len(planned))
        trajectories = [row_to_trajectory(row) for row in rows]
        intact = len(rows) == len(planned) and all(
            t.id == want == trajectory_id(t) for t, want in zip(trajectories, planned, strict=True))
    except (OSError, ValueError):  # pyarrow's errors on damaged bytes derive from these
        intact = False
    if not intact:
        with tempfile.TemporaryDirectory(prefix="race-check-") as tmp:
            store.get_file(digest, os.path.join(tmp, "trajectories.parquet"))  # raises on corrupt bytes
        raise ValueError(f"shard {unit['index']} of trajectories {digest}: its trajectories are not the planned ones "
                         "(other shard size or input?)")
    return trajectories, read


@dataclass
class _Reuse:
    """Decisions of trajectories already committed in shards of another size (same scope): the
    stage indexes them once (`index`), each unit carries its part (`where`: trajectory id -> key)."""

    store: ArtifactStore
    where: dict[str, str] = field(default_factory=dict)  # trajectory id -> shard key
    manifests: dict[str, dict[str, Any]] = field(default_factory=dict)
    _rows: dict[str, tuple[dict[str, list], dict[str, list]]] = field(default_factory=dict)

    @classmethod
    def index(cls, store: ArtifactStore, scope: str, planned: set[str]) -> _Reuse:
        reuse = cls(store)
        for key in store.list_manifests(SHARD_STAGE):
            if key.startswith(scope + "-") and key not in planned and (manifest := committed(store, key)):
                reuse.manifests[key] = manifest
                reuse.where.update(dict.fromkeys(manifest["trajectory_ids"], key))
        return reuse

    def manifest(self, key: str) -> dict[str, Any]:
        if key not in self.manifests:
            manifest = committed(self.store, key)
            if manifest is None:
                raise LookupError(f"cover: shard {key} to copy decisions from is gone; run again")
            self.manifests[key] = manifest
        return self.manifests[key]

    def rows(self, trajectory_id: str) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
        """(decision rows, reject rows) of a trajectory decided before."""
        key = self.where[trajectory_id]
        if key not in self._rows:
            if len(self._rows) >= 4:  # shards are read in input order: keep the latest few
                self._rows.pop(next(iter(self._rows)))
            objects = self.manifest(key)["objects"]
            grouped: tuple[dict[str, list], dict[str, list]] = ({}, {})
            for side, kind in zip(grouped, ("decisions", "rejects"), strict=True):
                for row in iter_rows_from_store(self.store, objects[kind], kind):
                    side.setdefault(row["trajectory_id"], []).append(row)
            self._rows[key] = grouped
        decisions, rejects = self._rows[key]
        return decisions.get(trajectory_id, []), rejects.get(trajectory_id, [])


def shard_units(store: ArtifactStore, scope: str, plan: list[Shard], shard_size: int, force: bool) -> list[Unit]:
    """The units of the shards of `plan` not committed yet (with `force`: all), each with the
    decisions it copies from committed shards of another size (none with `force`)."""
    todo = plan if force else [s for s in plan if committed(store, shard_key(scope, s)) is None]
    if not todo:
        return []
    reuse = _Reuse(store) if force else _Reuse.index(store, scope, {shard_key(scope, s) for s in plan})
    return [{"index": s.index, "start": s.index * shard_size, "ids": list(s.ids),
             "reuse": {i: reuse.where[i] for i in s.ids if i in reuse.where}} for s in todo]


@dataclass
class CoverJob(UnitJob):
    """The cover's shards as units: the trajectories object, the model, the cover's settings."""

    trajectories: str
    policy: PolicyRef
    config: CoverConfig
    resources: Resources
    scope: str
    make_scorer: Callable[[], Any] | None = None  # this process only: a scorer given to the stage

    kind = "cover-shard"
    what = "cover"
    noun = "shards"

    def spec(self) -> dict[str, Any]:
        if self.make_scorer is not None:
            raise ValueError("a cover given its own scorer runs its shards in this process: use --executor local")
        return {"trajectories": self.trajectories, "policy": asdict(self.policy), "config": asdict(self.config),
                "resources": asdict(self.resources), "scope": self.scope}

    @classmethod
    def from_spec(cls, spec: dict[str, Any]) -> CoverJob:
        config, resources = from_dict(CoverConfig, spec["config"]), from_dict(Resources, spec["resources"])
        policy = PolicyRef(**spec["policy"])
        check_same_scope("shard", shard_scope(config, resources, policy.digest), spec["scope"])
        return cls(spec["trajectories"], policy, config, resources, spec["scope"])

    def portable(self, store: ArtifactStore) -> CoverJob:
        return replace(self, policy=self.policy.stored(store))

    def committed(self, store: ArtifactStore, unit: Unit) -> dict[str, Any] | None:
        return committed(store, shard_key(self.scope, Shard(unit["index"], tuple(unit["ids"]))))

    def size(self, unit: Unit) -> int:
        return len(unit["ids"])

    def units_per_process(self, resources: Resources) -> int:
        return resources.pool_shards

    def worker(self, store: ArtifactStore, device: str, publish: Callable[[Any], None] | None = None,
               planned: list[Unit] | None = None) -> CoverWorker:
        return CoverWorker(self, store, device, publish, planned)


class CoverWorker(UnitWorker):
    """Scores a cover job's shards in this process with one scorer (built on the first shard that
    needs it) and commits each."""

    def __init__(self, job: CoverJob, store: ArtifactStore, device: str, publish: Callable[[Any], None] | None,
                 planned: list[Unit] | None):
        from race_core.progress import CoverProgress

        self.job, self.store, self.device = job, store, device
        total = sum(map(job.size, planned)) if planned is not None else None
        self.progress = CoverProgress(total, publish=publish)
        self.sized = replace(job.resources, device=device)
        self.scorer = self._shard_scorer()
        self.reuse = _Reuse(store)
        self._shard: tuple[int, Any] | None = None  # the shard being scored, and the progress before it

    def _shard_scorer(self) -> ShardScorer:
        sized, path = self.sized, self.job.policy.local_path(self.store)
        return ShardScorer(self.job.config, self.job.policy.digest,
                           self.job.make_scorer or (lambda: cover_scorer(self.job.config, path, sized)), self.progress)

    def can_shrink(self) -> bool:
        """A scorer built here can be rebuilt smaller; one given to the stage cannot."""
        return self.job.make_scorer is None and can_shrink(self.sized)

    def shrink(self) -> None:
        """The failed shard's progress taken back, its scorer (model and kept prefixes) freed, and a
        new one built with half the batch and KV budget (`tasks.cover_scoring.shrunk`)."""
        index, mark = self._shard
        self.progress.rewind(mark)
        self.scorer.close()
        self.sized, change = shrunk(self.sized)
        self.scorer = self._shard_scorer()
        self.progress.log(f"cover: out of memory on shard {index}: scoring it again with {change}", logging.WARNING)

    def do(self, unit: Unit, force: bool = False) -> dict[str, Any]:
        shard = Shard(unit["index"], tuple(unit["ids"]))
        key = shard_key(self.job.scope, shard)
        if not force and committed(self.store, key) is not None:  # another writer finished it meanwhile
            self.progress.skip(len(shard.ids))
            return {"committed": False, "skipped": True, "read_bytes": 0, "load_s": 0.0}
        self._shard = shard.index, self.progress.mark()
        loaded = self.scorer.load_s
        trajectories, read = read_shard(self.store, self.job.trajectories, unit)
        self.reuse.where.update(unit.get("reuse") or {})
        ours, reused = _score_and_commit(self.store, key, shard, trajectories, self.reuse, self.scorer, self.device,
                                         read, force)
        self.progress.log(f"cover: shard {shard.index} ({len(shard.ids)} trajectories) "
                          + ("committed" if ours else "was committed by another run meanwhile; this copy is dropped"))
        return {"committed": ours, "skipped": False, "reused": reused, "read_bytes": read,
                "load_s": round(self.scorer.load_s - loaded, 3)}

    def close(self) -> None:
        self.progress.close()
        self.scorer.close()


class _Rows(list):
    """Collects what `tasks.cover_scoring._within` refuses (it writes Reject items)."""

    def write(self, item: Any) -> None:
        self.append(item)


def _score_and_commit(store: ArtifactStore, key: str, shard: Shard, trajectories: list[Trajectory],
                      reuse: _Reuse, work: ShardScorer, device: str, read_bytes: int, force: bool
                      ) -> tuple[bool, int]:
    """Score the shard's trajectories not decided before, commit the shard; (committed by us, reused)."""
    fresh = [t for t in trajectories if t.id not in reuse.where]
    work.progress.skip(len(trajectories) - len(fresh))
    refused_now = _Rows()
    began, loaded = time.perf_counter(), work.load_s
    scored, tokens, counted = work.score(fresh, refused_now) if fresh else ([], 0, {})
    load_s = work.load_s - loaded
    score_s = time.perf_counter() - began - load_s
    decided_now: dict[str, list[Any]] = {}
    for row in scored:
        decided_now.setdefault(row["trajectory_id"], []).append(row)
    for reject in refused_now:
        decided_now.setdefault(reject.trajectory_id, [])
    refused_by_id = {reject.trajectory_id: [reject] for reject in refused_now}
    too_long = 0
    source: dict[str, Any] | None = None
    objects, sizes = {}, {}
    with tempfile.TemporaryDirectory(prefix="race-shard-") as tmp:
        paths = {kind: os.path.join(tmp, f"{kind}.parquet") for kind in ("decisions", "rejects")}
        with DatasetWriter("decisions", paths["decisions"]) as decided, \
                DatasetWriter("rejects", paths["rejects"]) as refused:
            for trajectory in trajectories:  # rows in shard order, scored now or copied
                if trajectory.id in reuse.where:
                    rows, rejects = reuse.rows(trajectory.id)
                    source = source or reuse.manifest(reuse.where[trajectory.id])
                else:
                    rows, rejects = decided_now.get(trajectory.id, []), refused_by_id.get(trajectory.id, [])
                decided.write_many(rows)
                refused.write_many(rejects)
                too_long += bool(rejects)
        for kind, path in paths.items():
            objects[kind] = store.put_file(path)
            sizes[objects[kind]] = os.path.getsize(path)
    earlier = (source or {}).get("metrics", {})
    stats = work.scorer.stats if work.scorer is not None and fresh else None
    metrics = {"trajectories": len(trajectories) - too_long, "too_long": too_long,
               "reused": len(trajectories) - len(fresh), "decision_rows": decided.rows,
               "scorer_noise": work.noise if fresh else None, "tokens_processed": tokens,
               "kv_bytes_peak": stats.kv_bytes_peak if stats else 0, "kv_evictions": stats.evictions if stats else 0,
               "context_tokens": work.limit if work.scorer is not None else earlier.get("context_tokens"),
               "render_mode": work.ctx.render_mode if work.ctx is not None else earlier.get("render_mode"),
               "work": counted,
               "read_bytes": read_bytes, "load_s": round(load_s, 3), "score_s": round(score_s, 3)}
    record = {"stage": SHARD_STAGE, "key": key, "trajectory_ids": list(shard.ids), "objects": objects,
              "object_sizes": sizes, "metrics": metrics, **unit_provenance(device)}
    return commit_record(store, manifest_record(key), record, force), metrics["reused"]


def merge_shards(store: ArtifactStore, scope: str, plan: list[Shard]) -> dict[str, Any]:
    """The stage output from its committed shards, in input order: `objects` and `metrics`."""
    manifests = []
    for shard in plan:
        manifest = committed(store, shard_key(scope, shard))
        if manifest is None:
            raise LookupError(f"cover: shard {shard.index} ({shard_key(scope, shard)}) has no usable manifest "
                              "after scoring: run again to score it")
        manifests.append(manifest)
    with TempDataset(store, "decisions") as decided, TempDataset(store, "rejects") as refused:
        for manifest in manifests:
            decided.writer.write_many(iter_rows_from_store(store, manifest["objects"]["decisions"], "decisions"))
            refused.writer.write_many(iter_rows_from_store(store, manifest["objects"]["rejects"], "rejects"))
    metrics = [m["metrics"] for m in manifests]

    def total(name: str) -> int:
        return sum(m.get(name) or 0 for m in metrics)

    def first(name: str) -> Any:
        return next((m[name] for m in metrics if m.get(name) is not None), None)

    noises = [m["scorer_noise"] for m in metrics if m.get("scorer_noise") is not None]
    logger.info(f"cover: {len(plan)} shards merged: {decided.rows} decision rows")
    return {"objects": {"decisions": decided.digest, "rejects": refused.digest},
            "shards": {"stage": SHARD_STAGE, "scope": scope, "ids_digests": [s.ids_digest for s in plan]},
            "metrics": {"trajectories": total("trajectories"), "too_long": total("too_long"),
                        "decision_rows": decided.rows, "scorer_noise": max(noises) if noises else None,
                        "tokens_processed": total("tokens_processed"),
                        "kv_bytes_peak": max((m.get("kv_bytes_peak") or 0 for m in metrics), default=0),
                        "kv_evictions": total("kv_evictions"), "context_tokens": first("context_tokens"),
                        "render_mode": first("render_mode"), "shards": len(plan),
                        "trajectories_reused": total("reused"), "work": sum_work(m.get("work") for m in metrics)}}
