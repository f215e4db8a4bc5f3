"""Content-addressed artifact store (fsspec), Parquet datasets, catalog of processed ids.

Depends on `race_core.schema` for the data classes only; never imports Prefect.
"""

from storage.catalog import Catalog, Scope
from storage.checkpoints import UnsafeCheckpointError, put_checkpoint, restore_checkpoint
from storage.keys import stage_key
from storage.parquet import (
    COMPRESSED_SCHEMA,
    DECISIONS_SCHEMA,
    REJECTS_SCHEMA,
    SCHEMAS,
    TRAJECTORIES_SCHEMA,
    DatasetWriter,
    compressed_row,
    iter_rows,
    iter_rows_from_store,
    iter_trajectories,
    read_dataset,
    read_dataset_from_store,
    row_to_trajectory,
    trajectory_row,
    write_dataset,
    write_dataset_to_store,
)
from storage.store import ArtifactStore, CorruptObjectError, MissingObjectError, StoreIOError

__all__ = [
    "ArtifactStore",
    "COMPRESSED_SCHEMA",
    "Catalog",
    "CorruptObjectError",
    "DECISIONS_SCHEMA",
    "DatasetWriter",
    "MissingObjectError",
    "REJECTS_SCHEMA",
    "SCHEMAS",
    "Scope",
    "StoreIOError",
    "TRAJECTORIES_SCHEMA",
    "UnsafeCheckpointError",
    "compressed_row",
    "iter_rows",
    "iter_rows_from_store",
    "iter_trajectories",
    "put_checkpoint",
    "read_dataset",
    "read_dataset_from_store",
    "restore_checkpoint",
    "row_to_trajectory",
    "stage_key",
    "trajectory_row",
    "write_dataset",
    "write_dataset_to_store",
]
