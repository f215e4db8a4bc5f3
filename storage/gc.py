"""Garbage collection of an `ArtifactStore` (docs/architecture.md §7) that a running stage survives.

A stage puts its objects first and writes its manifest last, so between the two its objects are
unreferenced. `collect_garbage` therefore leaves alone everything younger than a grace period
(`DEFAULT_GRACE_HOURS` unless told): unreferenced objects, and the litter of killed writers, which
it also removes once old: `.tmp-*` files (local temp names that were never renamed), objects moved
to `quarantine/` when a read found them corrupt, S3 multipart uploads never completed, and the
leases of pool child runs (`leases/`, `tasks.pool`) that died with their parent (a live lease is
rewritten every few seconds, so it is never that old). Reusing
an existing object refreshes its age (`ArtifactStore.put_bytes`), so an old unreferenced object that
a rerun produces again is young again.

Ages are measured on the store's clock, not this host's: `store_clock` writes a probe, reads the
time the store gave it and removes it. A host whose clock runs ahead of the store's would otherwise
take objects a running stage has just written (and a live lease), and one whose clock lags would
keep old litter; a lease or object dated in the future (a writer whose clock ran ahead, on a
filesystem that takes the writer's time) is young until the store's clock passes it. When the probe
cannot be written (a dry run on a read-only store) this host's clock is used, and the report says so.

The objects are listed before the references are read: an object committed in between is then
referenced, not taken. What remains is a stage that reuses an old object while a `gc` runs; its
manifest then points at a missing object, which the next hit check sees and recomputes.

Multipart uploads: s3fs offers `list_multipart_uploads(bucket)` (the bucket's first 1000, all
prefixes), `abort_mpu(bucket, key, upload_id)`, and `clear_multipart_uploads(bucket)`, which aborts
every upload of the bucket, running ones and other prefixes' included, so it is not used here:
only this root's uploads older than the grace period are aborted. A bucket lifecycle rule
(`AbortIncompleteMultipartUpload` after a day or so) is the complete answer on a shared bucket.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from storage.store import (
    _DIGEST,
    DEFAULT_GRACE_HOURS,
    QUARANTINE,
    REFERENCE_ROOTS,
    TEMP_PREFIX,
    ArtifactStore,
)

HOUR_S = 3600.0
LEASES = "leases"  # tasks.pool.lease_record


@dataclass
class GCReport:
    """What `collect_garbage` found: removed unless it was a dry run (paths relative to the root)."""

    objects: list[str] = field(default_factory=list)  # unreferenced objects older than the grace period
    young: list[str] = field(default_factory=list)  # unreferenced but younger: kept (maybe not committed yet)
    temp_files: list[str] = field(default_factory=list)  # abandoned `.tmp-*` files older than the grace period
    quarantined: list[str] = field(default_factory=list)  # corrupt objects moved aside, older than the grace
    uploads: list[str] = field(default_factory=list)  # abandoned S3 multipart uploads older than the grace
    leases: list[str] = field(default_factory=list)  # pool child runs' leases not renewed for the grace period
    clock_offset_s: float | None = None  # the store's clock minus this host's; None: not measured (host clock used)


def collect_garbage(store: ArtifactStore, dry_run: bool = True, grace_hours: float = DEFAULT_GRACE_HOURS) -> GCReport:
    """List (and unless `dry_run` remove) what no record references and what killed writers left,
    older than `grace_hours`: unreferenced objects, abandoned temp files, quarantined objects and
    multipart uploads."""
    grace_s = grace_hours * HOUR_S
    now, offset = store_clock(store)
    objects = _ages(store, "objects", now)  # listed before the references are read (module doc)
    keep = store.referenced_objects()
    report = GCReport(clock_offset_s=offset)
    for path, age in sorted(objects.items()):
        name = _name(path)
        if _DIGEST.match(name) and name not in keep:
            (report.objects if age >= grace_s else report.young).append(name)
    for top in ("objects", *REFERENCE_ROOTS):
        ages = objects if top == "objects" else _ages(store, top, now)
        report.temp_files += [_relative(store, p) for p, age in sorted(ages.items())
                              if _name(p).startswith(TEMP_PREFIX) and age >= grace_s]
    report.quarantined = [_relative(store, p) for p, age in sorted(_ages(store, QUARANTINE, now).items())
                          if age >= grace_s]
    report.leases = [_relative(store, p) for p, age in sorted(_ages(store, LEASES, now).items()) if age >= grace_s]
    uploads = _abandoned_uploads(store, grace_s, now)
    report.uploads = [f"{u['Key']} (upload {u['UploadId']})" for u in uploads]
    if not dry_run:
        for digest in report.objects:
            store.fs.rm_file(store.object_path(digest))
        for relative in report.temp_files + report.quarantined + report.leases:
            store.fs.rm_file(f"{store.root}/{relative}")
        for upload in uploads:
            store.fs.abort_mpu(store.root.split("/", 1)[0], upload["Key"], upload["UploadId"])
    return report


def _name(path: str) -> str:
    return path.rstrip("/").rsplit("/", 1)[-1]


def _relative(store: ArtifactStore, path: str) -> str:
    return path[len(store.root) + 1:] if path.startswith(store.root + "/") else path


def store_clock(store: ArtifactStore) -> tuple[float, float | None]:
    """The store's now (POSIX seconds) and its offset from this host's clock: the time the store
    gives a probe written now (module doc); this host's now and None when it cannot be written."""
    probe = f"{store.root}/objects/{TEMP_PREFIX}clock-{uuid.uuid4().hex}"
    before = time.time()
    try:
        store._write_bytes_atomic(probe, b"")
        store.fs.invalidate_cache(probe)
        stamped = _modified(store.fs.info(probe))
        store.fs.rm_file(probe)
    except OSError:
        return time.time(), None
    if stamped is None:  # a filesystem that reports no times: nothing to compare
        return time.time(), None
    return stamped, round(stamped - before, 3)


def _ages(store: ArtifactStore, top: str, now: float) -> dict[str, float]:
    """Path -> age in seconds, on the clock of `now`, of every file under `root/top` (0: a file
    whose time the filesystem does not report, taken as young)."""
    base = f"{store.root}/{top}"
    if not store._exists(base):
        return {}
    ages = {}
    for path, info in store.fs.find(base, detail=True).items():
        modified = _modified(info)
        ages[path] = 0.0 if modified is None else now - modified
    return ages


def _modified(info: dict[str, Any]) -> float | None:
    """A listed file's modification time (POSIX seconds) from fsspec's info: `mtime` (local),
    `LastModified` (S3), `updated` (GCS), `created` (memory); None when there is none."""
    for key in ("mtime", "LastModified", "last_modified", "updated", "created"):
        value = info.get(key)
        if isinstance(value, datetime):
            return value.timestamp()
        if isinstance(value, (int, float)):
            return float(value)
        if isinstance(value, str):
            try:
                return datetime.fromisoformat(value.replace("Z", "+00:00")).timestamp()
            except ValueError:
                continue
    return None


def _abandoned_uploads(store: ArtifactStore, grace_s: float, now: float) -> list[dict[str, Any]]:
    """S3 multipart uploads under this root started more than `grace_s` ago; none elsewhere."""
    lister = getattr(store.fs, "list_multipart_uploads", None)
    if lister is None or not hasattr(store.fs, "abort_mpu"):
        return []
    bucket, _, prefix = store.root.partition("/")
    return [u for u in lister(bucket) if u["Key"].startswith(f"{prefix}/" if prefix else "")
            and now - u["Initiated"].timestamp() >= grace_s]


def discard_unreferenced(store: ArtifactStore, digests: Iterable[str]) -> list[str]:
    """Remove the objects among `digests` (trees with their files) that no record reaches now, at
    once, without a grace period: for a writer that just replaced its own record of them (an RL run's
    superseded training state, `tasks.rl_run`), whose large objects no other stage wrote. A file that
    another record reaches (a tokenizer every checkpoint shares) stays. Returns the removed digests."""
    candidates: set[str] = set()
    for digest in digests:
        if store.has_object(digest):
            candidates.add(digest)
            if store._is_tree(digest):
                candidates.update(store.read_tree(digest).values())
    if not candidates:
        return []
    keep = store.referenced_objects()
    removed = sorted(d for d in candidates if d not in keep and store.has_object(d))
    for digest in removed:
        store.fs.rm_file(store.object_path(digest))
    return removed
