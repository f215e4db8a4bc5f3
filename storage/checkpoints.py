"""Checkpoints as artifacts: a `save_pretrained` folder stored as a tree object (docs/architecture.md §7).

Only safe formats are stored: a folder holding pickled weights (`*.bin`, `*.pt`, `*.pth`, `*.pkl`,
`*.ckpt`, ...) is refused; save with `safe_serialization=True` (safetensors) instead.
"""

from __future__ import annotations

import os
from pathlib import Path

from storage.store import ArtifactStore

PICKLE_SUFFIXES = frozenset({".bin", ".pt", ".pth", ".pkl", ".pickle", ".ckpt", ".joblib", ".npy"})


class UnsafeCheckpointError(ValueError):
    """A checkpoint folder holding a pickle-based file."""


def put_checkpoint(store: ArtifactStore, folder: str | os.PathLike[str]) -> str:
    """Store a checkpoint folder; return its digest (the folder's tree object)."""
    folder = Path(folder)
    unsafe = sorted(
        p.relative_to(folder).as_posix()
        for p in folder.rglob("*")
        if p.is_file() and p.suffix.lower() in PICKLE_SUFFIXES
    )
    if unsafe:
        raise UnsafeCheckpointError(
            f"checkpoint {folder} holds pickle-based files {unsafe}; save with safetensors "
            f"(save_pretrained(..., safe_serialization=True))"
        )
    return store.put_folder(folder)


def restore_checkpoint(store: ArtifactStore, digest: str, dest: str | os.PathLike[str]) -> Path:
    """Materialize checkpoint `digest` under `dest` (idempotent, every file verified); return `dest`."""
    return store.restore_folder(digest, dest)
