"""Units of work: what a stage hands an executor (docs/architecture.md §8 scale-out).

A stage whose work splits (the cover into shards, the sample stage into chunks) describes it as a
`UnitJob`: its units (small JSON dicts), whether a unit is committed, and a `UnitWorker` that does
units one after another in one process (the model loaded on the first unit that needs it and kept
for the rest) and commits each unit's manifest create-if-absent (`commit_record`). A job is named
by its `kind` (a key of `UNIT_KINDS`) and its `spec()` (JSON), from which any process rebuilds it
with `job_from_spec`: a Prefect child run or a Ray actor on another host needs the installed
package, the store URL and the spec, nothing else. A spec names its model by a checkpoint object in
the store (`portable`), never by a local path.

An executor (`tasks.executors`) runs a job's units in this process, on a Prefect work pool or on
Ray, and knows nothing of what they are; the stage never asks which executor ran them: it merges
the committed units' manifests.
"""

from __future__ import annotations

import os
import socket
from abc import ABC, abstractmethod
from collections.abc import Callable
from datetime import datetime, timezone
from importlib import import_module
from typing import Any, ClassVar

from storage import ArtifactStore
from storage.store import code_version

Unit = dict[str, Any]

# kind -> "module:class" of its UnitJob (imported only when a job of that kind is rebuilt)
UNIT_KINDS: dict[str, str] = {
    "cover-shard": "tasks.shards:CoverJob",
    "sample-chunk": "tasks.chunks:SampleJob",
}


def out_of_memory(exc: BaseException) -> bool:
    """An allocation that did not fit: accelerate's test (`should_reduce_batch_size`: the messages of
    the CUDA, XPU, MPS and CPU allocators) or Python's MemoryError (numpy, the standard library)."""
    from accelerate.utils.memory import should_reduce_batch_size

    return isinstance(exc, MemoryError) or should_reduce_batch_size(exc)


class UnitWorker(ABC):
    """Does a job's units in this process, in turn; `close()` frees the model. Executors call `run`,
    which does a unit again smaller when memory runs out (a worker that can shrink says so)."""

    @abstractmethod
    def do(self, unit: Unit, force: bool = False) -> dict[str, Any]:
        """Do the unit (unless it is committed already, and not `force`) and commit it; returns
        counts: `committed` (this worker's copy won), `skipped` (committed before), `read_bytes`
        (of the job's input read for it), `load_s` (model load time it paid)."""

    def can_shrink(self) -> bool:
        """Whether `shrink` can make the next try of a unit need less memory (default: no)."""
        return False

    def shrink(self) -> None:
        """Make the next try of a unit need less memory (and log how)."""
        raise NotImplementedError

    def run(self, unit: Unit, force: bool = False) -> dict[str, Any]:
        """`do` the unit; out of memory (`out_of_memory`), `shrink` and do it again until it fits, or
        raise the error when nothing can shrink. On a Prefect pool, on Ray and in this process alike."""
        from accelerate.utils.memory import clear_device_cache

        while True:
            try:
                return self.do(unit, force)
            except Exception as exc:  # noqa: BLE001 - only out of memory is retried, everything else re-raised
                if not out_of_memory(exc) or not self.can_shrink():
                    raise
            # past the except block: the failed try's frames, and the memory they held, are released
            clear_device_cache(garbage_collection=True)
            self.shrink()

    def close(self) -> None:
        return None


class UnitJob(ABC):
    """A stage's units of work, described so that any process can do them."""

    kind: ClassVar[str]  # its key in UNIT_KINDS
    what: ClassVar[str]  # the stage, as log lines name it
    noun: ClassVar[str]  # its units, plural ("shards")

    @abstractmethod
    def spec(self) -> dict[str, Any]:
        """The JSON from which `from_spec` rebuilds this job in another process."""

    @classmethod
    @abstractmethod
    def from_spec(cls, spec: dict[str, Any]) -> UnitJob:
        """The job `spec()` described; an error if this process's code would key it otherwise."""

    @abstractmethod
    def committed(self, store: ArtifactStore, unit: Unit) -> dict[str, Any] | None:
        """The unit's manifest if it is committed and its objects are all there."""

    @abstractmethod
    def worker(self, store: ArtifactStore, device: str, publish: Callable[[Any], None] | None = None,
               planned: list[Unit] | None = None) -> UnitWorker:
        """A worker doing this job's units on `device`; `publish(figures)` receives its progress,
        `planned` (when known) are the units it will be given (for progress totals)."""

    def portable(self, store: ArtifactStore) -> UnitJob:
        """This job as another host can do it: its model as a checkpoint object of `store`."""
        return self

    def index(self, unit: Unit) -> int:
        return int(unit["index"])

    def units_per_process(self, resources: Any) -> int:
        """Units given together to a process that starts for them (a pool's child run)."""
        return 1

    def size(self, unit: Unit) -> int:
        """The unit's weight in progress figures (trajectories for the cover)."""
        return 1


def job_from_spec(kind: str, spec: dict[str, Any]) -> UnitJob:
    """Rebuild a job of `kind` from its spec (in a pool's child run, in a Ray actor)."""
    try:
        module, name = UNIT_KINDS[kind].split(":")
    except KeyError:
        raise ValueError(f"unknown unit kind {kind!r}: known kinds are {sorted(UNIT_KINDS)}") from None
    return getattr(import_module(module), name).from_spec(spec)


def check_same_scope(what: str, mine: str, theirs: str) -> None:
    """A worker whose code or library versions key the units otherwise than the submitting run must
    not commit them under the submitter's keys."""
    if mine != theirs:
        raise ValueError(f"this worker's code or library versions differ from the submitting run's ({what} scope "
                         "mismatch): install the same version of race-pipeline on every worker")


# -- committing a unit ---------------------------------------------------------------------------
def usable(store: ArtifactStore, record: str) -> dict[str, Any] | None:
    """The unit manifest at `record` if it is committed and its objects are all there, else None."""
    manifest = store.read_record(record)
    if manifest is None or store.manifest_damage(manifest) is not None:
        return None
    return manifest


def commit_record(store: ArtifactStore, record: str, manifest: dict[str, Any], force: bool = False) -> bool:
    """Commit a unit manifest create-if-absent: False when another writer's copy is there first
    (ours is dropped). A damaged one (an object lost) is replaced, and with `force` any."""
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
