"""The cover stage's unit of work: the shard (DESIGN §7, §8 scale-out).

The cover's input is cut, in its stored order, every `resources.shard_size` trajectories. A shard is
named by what it holds, not where it sits: its key is `<scope>-<sha256 of its trajectory ids>`,
where the scope is the stage key of everything else the decisions depend on (cover config and
dtype, model digest, the cover's code fingerprint and library versions), and a trajectory id is
the hash of its content. Each scored shard commits `decisions` and `rejects` objects plus a
manifest `stages/cover-shard/<key>.json`, written create-if-absent: a second writer of the same
shard (a run submitted again after its worker went silent, a second process on the same store)
finds it present and drops its own copy, so no shard is ever scored twice into the result.

The stage output (`decisions`, `rejects`, what `compress` and `race cover` read) is the shards'
rows concatenated in input order, whatever ran where: the same rows, in the same order, as one
process scoring shard after shard. A run that stops (killed, out of memory, failed) leaves its
finished shards committed; the next one resumes at the first shard without a manifest.

Shard size changed: the new shards have new keys, but a trajectory already decided in a committed
shard of the same scope is not scored again: its decision and reject rows are copied from that
shard (each trajectory's decisions do not depend on its shard-mates, DESIGN §4), and only the rest
is scored. The committed shards of other sizes are found by listing the scope's manifests, done
only when some shard of the plan is missing.
"""

from __future__ import annotations

import hashlib
import os
import socket
import tempfile
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Any

from race_core.config import CoverConfig, Resources
from race_core.schema import Trajectory
from race_core.scoring import sum_work
from storage import ArtifactStore, stage_key
from storage.parquet import DatasetWriter, iter_rows_from_store, read_dataset_from_store
from storage.store import code_version
from tasks.fingerprints import stage_code
from tasks.stages import _within, cover_key_config, iter_trajectories

SHARD_STAGE = "cover-shard"
SHARD_VERSION = 1
Log = Callable[[str], None]


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


def usable(store: ArtifactStore, record: str) -> dict[str, Any] | None:
    """The unit manifest at `record` if it is committed and its objects are all there, else None."""
    manifest = store.read_record(record)
    if manifest is None or store.manifest_damage(manifest) is not None:
        return None
    return manifest


def committed(store: ArtifactStore, key: str) -> dict[str, Any] | None:
    """The shard's manifest if it is committed and its objects are all there, else None."""
    return usable(store, manifest_record(key))


def commit_record(store: ArtifactStore, record: str, manifest: dict[str, Any], force: bool = False) -> bool:
    """Commit a unit manifest (a shard's, a sample chunk's) create-if-absent: False when another
    writer's copy is there first (ours is dropped). A damaged one (an object lost) is replaced, and
    with `force` any."""
    existing = store.read_record(record)
    replace = force or (existing is not None and store.manifest_damage(existing) is not None)
    try:
        store.write_record(record, manifest, overwrite=replace)
    except FileExistsError:
        return False
    return True


def unit_provenance(device: str) -> dict[str, Any]:
    """Who committed a unit manifest, and when."""
    return {"created_at": datetime.now(timezone.utc).isoformat(), "code_version": code_version(),
            "created_by": f"{socket.gethostname()}:{os.getpid()}", "device": device}


def read_shards(store: ArtifactStore, trajectories_digest: str, shard_size: int, wanted: Iterable[Shard]
                ) -> Iterator[tuple[Shard, list[Trajectory]]]:
    """The trajectories of the `wanted` shards, one shard in memory at a time (the input is streamed
    once). A shard whose trajectories are not the ones planned is an error: the input changed."""
    by_index = {shard.index: shard for shard in wanted}
    if not by_index:
        return
    last = max(by_index)
    batch: list[Trajectory] = []
    for position, trajectory in enumerate(iter_trajectories(store, trajectories_digest)):
        index = position // shard_size
        if index > last:
            break
        if index in by_index:
            batch.append(trajectory)
            shard = by_index[index]
            if len(batch) == len(shard.ids):
                if tuple(t.id for t in batch) != shard.ids:
                    raise ValueError(f"shard {index} of trajectories {trajectories_digest}: its trajectories "
                                     "are not the planned ones (other shard size or input?)")
                yield shard, batch
                batch = []
    if batch:
        raise ValueError(f"shard {last} of trajectories {trajectories_digest}: the input ended inside it")


@dataclass
class ShardScorer:
    """Scores shards in one process: the scorer is built on the first trajectory that needs it and
    the scorer's noise measured once, on its first shard (as the one-loop cover did)."""

    config: CoverConfig
    model_digest: str
    make_scorer: Callable[[], Any]
    progress: Any  # race_core.progress.CoverProgress
    scorer: Any = None
    noise: float | None = None
    limit: int | None = None
    ctx: Any = None

    def _ready(self) -> Any:
        if self.scorer is None:
            from race_core.decisions import CoverContext
            from race_core.memory import format_size

            self.scorer = self.make_scorer()
            extra = self.scorer.stats.extra
            if extra.get("kv_budget"):
                self.progress.log(f"cover: KV-prefix copies kept within {format_size(extra['kv_budget'])} "
                                  f"({format_size(extra['kv_bytes_per_token'])} per token)")
            self.limit = min((n for n in (self.config.max_tokens, self.scorer.max_length) if n), default=None)
            renderer = self.scorer.renderer
            self.ctx = CoverContext(model_digest=self.model_digest, epsilon=self.config.epsilon,
                                    backend=self.config.backend,
                                    render_mode=renderer.render_mode if renderer else "plain")
        return self.scorer

    def score(self, trajectories: list[Trajectory], refused: Any) -> tuple[list[dict[str, Any]], int, dict[str, Any]]:
        """Decision rows of the trajectories that fit (too long ones go to `refused`), the tokens
        this took, and the cover's work counters (the noise measurement left out) with the work
        bound's tokens (`bound_tokens`)."""
        from race_core.cover import check_noise, logic_cover
        from race_core.decisions import decision_rows
        from race_core.progress import bound_tokens_by_round
        from race_core.scoring import ScoreRequest

        scorer = self._ready()
        tokens_before = scorer.stats.tokens_processed
        kept = _within(trajectories, scorer.renderer, self.limit, self.config.max_tokens, refused, self.progress.log)
        self.progress.skip(len(trajectories) - len(kept))
        if not kept:
            return [], 0, {}
        if self.noise is None:
            self.noise = scorer.measure_noise([ScoreRequest(("noise", i), t) for i, t in enumerate(kept[:4])])
            self.progress.log(f"cover: scorer noise {self.noise:.2e} (epsilon {self.config.epsilon:g})")
            check_noise(self.noise, self.config.epsilon)
        before = scorer.stats.work()
        results = logic_cover(kept, scorer, self.config.epsilon, early_reject=self.config.early_reject,
                              local_only=self.config.local_only,
                              progress=self.progress.shard(kept, scorer.renderer))
        rows = list(decision_rows(results, scorer.renderer, self.ctx))
        work = {**(scorer.stats.work() - before).counts(), "bound_tokens": sum(
            sum(bound_tokens_by_round(t, scorer.renderer)) for t in kept) if scorer.renderer else None}
        if scorer.renderer is not None:
            scorer.renderer.forget()  # texts recur within a shard, not across: memory flat in dataset size
        return rows, scorer.stats.tokens_processed - tokens_before, work

    def close(self) -> None:
        if self.scorer is not None:
            self.scorer.close()


@dataclass
class _Reuse:
    """Decisions of trajectories already committed in shards of another size (same scope)."""

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

    def rows(self, trajectory_id: str) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
        """(decision rows, reject rows) of a trajectory decided before."""
        key = self.where[trajectory_id]
        if key not in self._rows:
            if len(self._rows) >= 4:  # shards are read in input order: keep the latest few
                self._rows.pop(next(iter(self._rows)))
            objects = self.manifests[key]["objects"]
            grouped: tuple[dict[str, list], dict[str, list]] = ({}, {})
            for side, kind in zip(grouped, ("decisions", "rejects"), strict=True):
                for row in iter_rows_from_store(self.store, objects[kind], kind):
                    side.setdefault(row["trajectory_id"], []).append(row)
            self._rows[key] = grouped
        decisions, rejects = self._rows[key]
        return decisions.get(trajectory_id, []), rejects.get(trajectory_id, [])


def score_shards(store: ArtifactStore, trajectories_digest: str, shards: list[Shard], scope: str,
                 shard_size: int, work: ShardScorer, log: Log, device: str = "", force: bool = False
                 ) -> dict[str, int]:
    """Score each of `shards` not committed yet, in order, and commit it; returns counts: shards
    `scored` (and committed), `dropped` (committed by another writer first), trajectories `reused`.
    With `force` every shard is scored again (nothing reused) and replaces its manifest."""
    counts = {"scored": 0, "dropped": 0, "reused": 0}
    todo = shards if force else [s for s in shards if committed(store, shard_key(scope, s)) is None]
    work.progress.skip(sum(len(s.ids) for s in shards) - sum(len(s.ids) for s in todo))
    if not todo:
        return counts
    reuse = _Reuse(store) if force else _Reuse.index(store, scope, {shard_key(scope, s) for s in shards})
    for shard, trajectories in read_shards(store, trajectories_digest, shard_size, todo):
        key = shard_key(scope, shard)
        if not force and committed(store, key) is not None:  # another writer finished it meanwhile
            work.progress.skip(len(trajectories))
            continue
        ours, reused = _score_and_commit(store, key, shard, trajectories, reuse, work, device, force)
        counts["reused"] += reused
        if ours:
            counts["scored"] += 1
            log(f"cover: shard {shard.index} ({len(shard.ids)} trajectories) committed")
        else:
            counts["dropped"] += 1
            log(f"cover: shard {shard.index} was committed by another run meanwhile; this copy is dropped")
    return counts


class _Rows(list):
    """Collects what `_within` refuses (it writes Reject items)."""

    def write(self, item: Any) -> None:
        self.append(item)


def _score_and_commit(store: ArtifactStore, key: str, shard: Shard, trajectories: list[Trajectory],
                      reuse: _Reuse, work: ShardScorer, device: str, force: bool) -> tuple[bool, int]:
    """Score the shard's trajectories not decided before, commit the shard; (committed by us, reused)."""
    fresh = [t for t in trajectories if t.id not in reuse.where]
    work.progress.skip(len(trajectories) - len(fresh))
    refused_now = _Rows()
    scored, tokens, counted = work.score(fresh, refused_now) if fresh else ([], 0, {})
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
                    source = source or reuse.manifests[reuse.where[trajectory.id]]
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
               "work": counted}
    record = {"stage": SHARD_STAGE, "key": key, "trajectory_ids": list(shard.ids), "objects": objects,
              "object_sizes": sizes, "metrics": metrics, **unit_provenance(device)}
    return commit_record(store, manifest_record(key), record, force), metrics["reused"]


def merge_shards(store: ArtifactStore, scope: str, plan: list[Shard], log: Log) -> dict[str, Any]:
    """The stage output from its committed shards, in input order: `objects` and `metrics`."""
    from tasks.stages import _TempDataset

    manifests = []
    for shard in plan:
        manifest = committed(store, shard_key(scope, shard))
        if manifest is None:
            raise LookupError(f"cover: shard {shard.index} ({shard_key(scope, shard)}) has no usable manifest "
                              "after scoring: run again to score it")
        manifests.append(manifest)
    with _TempDataset(store, "decisions") as decided, _TempDataset(store, "rejects") as refused:
        for manifest in manifests:
            decided.writer.write_many(iter_rows_from_store(store, manifest["objects"]["decisions"], "decisions"))
            refused.writer.write_many(iter_rows_from_store(store, manifest["objects"]["rejects"], "rejects"))
    metrics = [m["metrics"] for m in manifests]

    def total(name: str) -> int:
        return sum(m.get(name) or 0 for m in metrics)

    def first(name: str) -> Any:
        return next((m[name] for m in metrics if m.get(name) is not None), None)

    noises = [m["scorer_noise"] for m in metrics if m.get("scorer_noise") is not None]
    log(f"cover: {len(plan)} shards merged: {decided.rows} decision rows")
    return {"objects": {"decisions": decided.digest, "rejects": refused.digest},
            "shards": {"stage": SHARD_STAGE, "scope": scope, "ids_digests": [s.ids_digest for s in plan]},
            "metrics": {"trajectories": total("trajectories"), "too_long": total("too_long"),
                        "decision_rows": decided.rows, "scorer_noise": max(noises) if noises else None,
                        "tokens_processed": total("tokens_processed"),
                        "kv_bytes_peak": max((m.get("kv_bytes_peak") or 0 for m in metrics), default=0),
                        "kv_evictions": total("kv_evictions"), "context_tokens": first("context_tokens"),
                        "render_mode": first("render_mode"), "shards": len(plan),
                        "trajectories_reused": total("reused"), "work": sum_work(m.get("work") for m in metrics)}}
