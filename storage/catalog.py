"""Catalog of processed trajectory ids, so nightly recompression only scores new ones.

A scope is what makes a compression result reusable: (model digest, epsilon, scorer settings).
Its canonical JSON hashes to a scope key. Each compressed part (a `compressed` Parquet object)
gets one NEW, append-only entry file:

    catalog/<scope_key>/<seq:08d>-<part_digest>.json
        {"scope": {...}, "part": digest, "ids": [...], "meta": {...}, "created_at": ...,
         "objects": {"part": digest}}

Entries are written like manifests (temp name + rename) and never rewritten; the `objects` key
makes the part reachable for `ArtifactStore.gc`.
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

    def parts(self, scope: Scope) -> list[dict[str, Any]]:
        """The scope's entries in append order (each has `part`, `ids`, `meta`, `created_at`)."""
        entries = []
        for name in self.store.list_records(self._dir(scope)):
            entry = self.store.read_record(f"{self._dir(scope)}/{name}")
            if entry is not None:
                entries.append(entry)
        return entries

    def compressed_ids(self, scope: Scope) -> set[str]:
        """Every trajectory id already compressed in this scope."""
        done: set[str] = set()
        for entry in self.parts(scope):
            done.update(entry["ids"])
        return done

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

        Writes one new entry file; old entries are never touched. Appending a part that is
        already recorded returns its existing entry (idempotent retries).
        """
        check_digest(part_digest)
        if not self.store.has_object(part_digest):
            raise MissingObjectError(part_digest)
        existing = self.parts(scope)
        for entry in existing:
            if entry["part"] == part_digest:
                return entry
        seq = 1 + max((int(e.get("seq", 0)) for e in existing), default=0)
        entry = {
            "seq": seq,
            "scope": scope.to_dict(),
            "scope_key": scope.key,
            "part": part_digest,
            "ids": list(ids),
            "meta": dict(meta or {}),
            "created_at": datetime.now(timezone.utc).isoformat(),
            "objects": {"part": part_digest},
        }
        self.store.write_record(f"{self._dir(scope)}/{seq:08d}-{part_digest}.json", entry, overwrite=False)
        return entry
