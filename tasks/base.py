"""What every stage function shares: the key-or-compute step (`run_stage`, docs/architecture.md §7), datasets
streamed into the store (`TempDataset`), reading the trajectories of a dataset object. No stage lives
here; the stage modules (`tasks.stages`, `tasks.shards`, `tasks.training_stages`, `tasks.ablation`)
import it, and it imports none of them.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterator
from typing import Any

from race_core.config import Resources, RLConfig, key_fields
from race_core.schema import Trajectory
from storage import ArtifactStore, stage_key
from storage.parquet import DatasetWriter, iter_rows_from_store, row_to_trajectory
from tasks.declarations import declared
from tasks.fingerprints import stage_code

TRAJECTORY_ROW_GROUP = 64  # rows per Parquet row group of a trajectories dataset: a shard reads only its own

logger = logging.getLogger(__name__)


class StageNotRun(LookupError):
    """A stage left out of a run has no usable stored output for these inputs."""

    def __init__(self, stage: str, damage: str | None = None):
        self.stage = stage
        held = f"its stored output is damaged ({damage})" if damage else "the store holds no output of it"
        super().__init__(f"stage {stage!r} was not selected and {held} for these inputs and settings: "
                         f"add {stage!r} to the stages to run")


def run_stage(store: ArtifactStore, stage: str, config: dict[str, Any],
              inputs: dict[str, str], model_digest: str | None,
              compute: Callable[[], dict[str, Any]], only_cached: bool = False, force: bool = False
              ) -> dict[str, Any]:
    """Return the stage's manifest, computing it only when the store has no usable one under its key.

    A stored manifest is reused only if every object it reaches is there at its recorded size
    (`ArtifactStore.manifest_damage`; reads verify digests and quarantine a corrupt object, so it
    counts as missing here on the next run); a damaged one is recomputed, and so is any with `force`.
    A returned manifest carries `cached` and `wall_s` (this call's time; a computed manifest
    stores its compute time as `wall_s` too). The key carries the version of the stage's declaration."""
    started = time.perf_counter()
    key = stage_key(stage, declared(stage).version, config, inputs, model_digest, stage_code(stage, config))
    existing = None if force else store.read_manifest(stage, key)
    damage = store.manifest_damage(existing) if existing is not None else None
    if existing is not None and damage is None:
        return {**existing, "cached": True, "wall_s": round(time.perf_counter() - started, 3)}
    if only_cached:
        raise StageNotRun(stage, damage)
    if damage:
        logger.warning(f"{stage}: recomputing ({damage})")
    elif force:
        logger.info(f"{stage}: recomputing (forced)")
    produced = compute()
    manifest = store.write_manifest(stage, key, {
        **produced, "inputs": inputs, "config": config, "model_digest": model_digest,
        "wall_s": round(time.perf_counter() - started, 3),
    })
    return {**manifest, "cached": False}


class TempDataset:
    """A Parquet dataset streamed to a temp file, put into the store on close."""

    def __init__(self, store: ArtifactStore, kind: str):
        import tempfile

        self.store, self.kind = store, kind
        self._dir = tempfile.TemporaryDirectory(prefix=f"race-{kind}-")
        self.path = f"{self._dir.name}/{kind}.parquet"
        self.writer = DatasetWriter(kind, self.path, **({"row_group_size": TRAJECTORY_ROW_GROUP}
                                                         if kind == "trajectories" else {}))
        self.digest: str | None = None

    @property
    def rows(self) -> int:
        return self.writer.rows

    def __enter__(self) -> TempDataset:
        return self

    def __exit__(self, exc_type, *rest) -> None:
        try:
            self.writer.close()
            if exc_type is None:
                self.digest = self.store.put_file(self.path)
        finally:
            self._dir.cleanup()


def iter_trajectories(store: ArtifactStore, digest: str, kind: str = "trajectories") -> Iterator[Trajectory]:
    for row in iter_rows_from_store(store, digest, kind):
        yield row_to_trajectory(row)


def _model_config(config: Any, resources: Resources, **extra: Any) -> dict[str, Any]:
    """A training stage's keyed config: its own settings and the dtype its model ran in."""
    return {**key_fields(config), "dtype": resources.dtype, **extra}


def _rl_keyed(config: RLConfig, resources: Resources, iteration: int) -> dict[str, Any]:
    # one iteration does not depend on how many follow it
    return {k: v for k, v in _model_config(config, resources, iteration=iteration).items() if k != "iterations"}
