"""Catalog of processed trajectory ids, so nightly recompression only scores new ones.

A scope is what makes a compression result reusable: (model digest, epsilon, scorer settings).
Its canonical JSON hashes to a scope key. Each compressed part (a `compressed` Parquet object)
gets one NEW, append-only entry file:

    catalog/<scope_key>/<seq:08d>.json
        {"seq": n, "scope": {...}, "part": digest, "ids": [...], "meta": {...}, "created_at": ...,
         "objects": {"part": digest}}

An append is create-if-absent, never check-then-write: the entry file named by its sequence number
is created only if no other writer has taken that number (`ArtifactStore.write_record(...,
overwrite=False)`: a hard link locally, `If-None-Match: *` on S3); a writer that loses the race
reads the catalog again and takes the next number. So two runs appending at once never share a
number and never lose a part. Entries are never rewritten; the `objects` key makes the part
reachable for `ArtifactStore.gc`. Stores written before this layout named entries
`<seq:08d>-<part_digest>.json`; they are read alike.

Readers tolerate overlap (two runs that scored the same trajectories before the nightly
deployment was serialized): a part recorded twice is listed once, and an id held by two parts
belongs to the first (`owners`).
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Any

from race_core.schema import canonical_json
from storage.store import ArtifactStore, MissingObjectError, check_digest


@dataclass(frozen=True)
class Scope:
    """What a compression depends on beyond the trajectory itself."""

    model_digest: str
    epsilon: float
    scorer: Mapping[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return {
            "model_digest": self.model_digest,
            "epsilon": float(self.epsilon),
            "scorer": dict(self.scorer),
        }

    @property
    def key(self) -> str:
        """sha256 hex of the scope's canonical JSON (stable across processes and dict order)."""
        return hashlib.sha256(canonical_json(self.to_dict()).encode("utf-8")).hexdigest()


class Catalog:
    """Which trajectory ids have been compressed in which parts, per scope."""

    def __init__(self, store: ArtifactStore):
        self.store = store

    def _dir(self, scope: Scope) -> str:
        return f"catalog/{scope.key}"

    def _entries(self, scope: Scope) -> tuple[list[dict[str, Any]], int]:
        """Every entry in append order, and the highest sequence number taken."""
        entries, last = [], 0
        for name in self.store.list_records(self._dir(scope)):
            last = max(last, _seq_of(name))
            entry = self.store.read_record(f"{self._dir(scope)}/{name}")
            if entry is not None:
                entries.append(entry)
        return entries, last

    def parts(self, scope: Scope) -> list[dict[str, Any]]:
        """The scope's entries in append order (each has `part`, `ids`, `meta`, `created_at`); a
        part recorded twice is listed once."""
        seen: set[str] = set()
        out = []
        for entry in self._entries(scope)[0]:
            if entry["part"] not in seen:
                seen.add(entry["part"])
                out.append(entry)
        return out

    def owners(self, scope: Scope) -> dict[str, str]:
        """Trajectory id -> the part that holds it; an id in two overlapping parts belongs to the
        first, so a reader that joins the parts keeps each id's row from its owner only."""
        owner: dict[str, str] = {}
        for entry in self.parts(scope):
            for i in entry["ids"]:
                owner.setdefault(i, entry["part"])
        return owner

    def compressed_ids(self, scope: Scope) -> set[str]:
        """Every trajectory id already compressed in this scope (an id in two parts counts once)."""
        return set(self.owners(scope))

    def new_ids(self, scope: Scope, ids: Iterable[str]) -> list[str]:
        """The ids not yet compressed in this scope, in the given order, each once."""
        done = self.compressed_ids(scope)
        out: list[str] = []
        for i in ids:
            if i not in done:
                done.add(i)
                out.append(i)
        return out

    def append_part(
        self, scope: Scope, part_digest: str, ids: Iterable[str], meta: Mapping[str, Any] | None = None
    ) -> dict[str, Any]:
        """Record that `part_digest` holds the compressed `ids`; return the entry.

        Writes one new entry file, created only if its sequence number is free; old entries are
        never touched. Appending a part that is already recorded returns its existing entry
        (idempotent retries, and two writers of the same part record it once).
        """
        check_digest(part_digest)
        if not self.store.has_object(part_digest):
            raise MissingObjectError(part_digest)
        ids, tried = list(ids), 0
        while True:
            entries, last = self._entries(scope)
            for entry in entries:
                if entry["part"] == part_digest:
                    return entry
            seq = max(last, tried) + 1
            entry = {
                "seq": seq,
                "scope": scope.to_dict(),
                "scope_key": scope.key,
                "part": part_digest,
                "ids": ids,
                "meta": dict(meta or {}),
                "created_at": datetime.now(timezone.utc).isoformat(),
                "objects": {"part": part_digest},
            }
            try:
                self.store.write_record(f"{self._dir(scope)}/{seq:08d}.json", entry, overwrite=False)
                return entry
            except FileExistsError:
                tried = seq  # another writer took this number: read again, take a later one


def _seq_of(name: str) -> int:
    """The sequence number an entry's file name starts with (`00000007.json`, `00000007-<part>.json`)."""
    head = name.split(".", 1)[0].split("-", 1)[0]
    return int(head) if head.isdigit() else 0
