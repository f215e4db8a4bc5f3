"""A policy as stages and workers pass it: its model digest, and where its files are.

`PolicyRef.local_path` gives a folder transformers can load: a local folder as is, a checkpoint
object of the store restored once into this host's checkpoint cache (`RACE_CHECKPOINT_CACHE`, by
default `.race/cache/checkpoints` under the working folder), keyed by the object's digest and
verified file by file. `PolicyRef.stored` puts a local folder into the store once (recorded under
`stages/checkpoint/<model digest>`), so a worker on another host can fetch it by digest.
"""

from __future__ import annotations

import os
import tempfile
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from race_core.config import Resources
from race_core.policy import checkpoint_digest
from storage import ArtifactStore, put_checkpoint, restore_checkpoint

CACHE_ENV = "RACE_CHECKPOINT_CACHE"
STORED_STAGE = "checkpoint"  # stages/checkpoint/<model digest>.json: the folder object of a local checkpoint


def checkpoint_cache() -> Path:
    return Path(os.environ.get(CACHE_ENV, Path(".race") / "cache" / "checkpoints"))


def materialize(store: ArtifactStore, folder_digest: str) -> str:
    """A local folder holding the checkpoint object `folder_digest` (restored once, verified)."""
    dest = checkpoint_cache() / folder_digest
    if not (dest / ".complete").exists():
        restore_checkpoint(store, folder_digest, dest)
        (dest / ".complete").write_text(folder_digest)
    return str(dest)


@dataclass(frozen=True)
class PolicyRef:
    """A policy checkpoint: `digest` identifies the model (its files); `folder` is the digest of its
    checkpoint folder object in the store, `path` a local save_pretrained folder (one of the two)."""

    digest: str
    folder: str | None = None
    path: str | None = None

    @classmethod
    def local(cls, path: str | Path) -> PolicyRef:
        return cls(digest=checkpoint_digest(path), path=str(path))

    @classmethod
    def of(cls, policy: PolicyRef | dict[str, Any]) -> PolicyRef:
        """A PolicyRef as is, or the policy that a training stage's manifest (sft, rl) produced."""
        if isinstance(policy, PolicyRef):
            return policy
        return cls(digest=policy["policy_digest"], folder=policy["objects"]["checkpoint"])

    def local_path(self, store: ArtifactStore) -> str:
        return self.path if self.path is not None else materialize(store, self.folder)

    def stored(self, store: ArtifactStore) -> PolicyRef:
        """This policy as a checkpoint object of `store` (put once; a later call finds it recorded)."""
        if self.folder is not None:
            return replace(self, path=None)
        known = store.read_manifest(STORED_STAGE, self.digest)
        if known is None or store.manifest_damage(known) is not None:
            known = store.write_manifest(STORED_STAGE, self.digest,
                                         {"objects": {"checkpoint": put_checkpoint(store, self.path)}})
        return PolicyRef(digest=self.digest, folder=known["objects"]["checkpoint"])

    def load(self, store: ArtifactStore, resources: Resources):
        """(model, tokenizer) on the device and in the dtype of `resources`."""
        from race_core.policy import load_policy

        return load_policy(self.local_path(store), device=resources.device, dtype=resources.dtype)


def put_policy(store: ArtifactStore, model, tokenizer) -> dict[str, Any]:
    """Save a trained policy into the store: the manifest fields `PolicyRef.from_manifest` reads."""
    from race_core.policy import save_policy

    with tempfile.TemporaryDirectory(prefix="race-policy-") as tmp:
        folder = save_policy(model, tokenizer, Path(tmp) / "policy")
        return {"objects": {"checkpoint": put_checkpoint(store, folder)}, "policy_digest": checkpoint_digest(folder)}
