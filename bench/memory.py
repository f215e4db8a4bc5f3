"""Peak RSS of the real cover stage (`tasks.stages.cover`, sharded) does not grow with N.

Each N runs in a fresh process (peak RSS is a high-water mark): the synthetic trajectories are
written to a temporary store as a `trajectories` dataset, the model is loaded, then the cover stage
covers them shard by shard and writes its `decisions` dataset, as in the pipeline."""

from __future__ import annotations

import json
import os
import resource
import subprocess
import sys
import tempfile
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from bench.workload import Workload, checkpoint_for, iter_synthetic
from race_core.render import Renderer

if TYPE_CHECKING:
    from storage import ArtifactStore

REPO_ROOT = Path(__file__).resolve().parents[1]


def cover_stage(store: ArtifactStore, trajectories_digest: str, checkpoint: Path, scorer_factory: Callable[[], Any],
                shard_size: int, batch_size: int) -> dict[str, Any]:
    """The one call of the real cover stage (`tasks.stages.cover`, default `CoverConfig`); its manifest."""
    from race_core.config import CoverConfig, Resources
    from race_core.policy import checkpoint_digest
    from tasks.stages import cover

    return cover(store, trajectories_digest, str(checkpoint), checkpoint_digest(checkpoint), CoverConfig(),
                 Resources(batch_size=batch_size, shard_size=shard_size), scorer_factory=scorer_factory)


def _peak_rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def memory_child(model_name: str, cache_dir: str, n: int, shard_size: int, turns: int, batch_size: int) -> dict:
    """Run in a fresh process: N synthetic trajectories through the cover stage in a temporary store."""
    from race_core.policy import load_policy
    from race_core.scoring.hf import HFScorer
    from storage import ArtifactStore
    from storage.parquet import iter_rows_from_store, write_dataset_to_store

    checkpoint = checkpoint_for(model_name, cache_dir)
    with tempfile.TemporaryDirectory(prefix="race-bench-memory-") as root:
        store = ArtifactStore(root)
        model, tokenizer = load_policy(checkpoint)
        trajectories, _ = write_dataset_to_store(store, "trajectories",
                                                 iter_synthetic(Renderer(tokenizer), Workload(n=n, turns=turns)))
        loaded = _peak_rss_mb()
        manifest = cover_stage(store, trajectories, checkpoint,
                               lambda: HFScorer(model, tokenizer, batch_size=batch_size), shard_size, batch_size)
        peak = _peak_rss_mb()
        accepted = sum(row["accepted"] for row in iter_rows_from_store(store, manifest["objects"]["decisions"],
                                                                       "decisions"))
    return {"N": manifest["metrics"]["trajectories"], "shard_size": shard_size, "T": turns, "model": model_name,
            "accepted_removals": accepted, "rss_after_load_mb": loaded, "peak_rss_mb": peak}


def memory_bench(model_name: str, cache_dir: str, sizes: Sequence[int], shard_size: int, turns: int,
                 batch_size: int) -> list[dict]:
    """`memory_child` once per N, each in its own process."""
    checkpoint_for(model_name, cache_dir)  # build once, outside the measured processes
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO_ROOT), os.environ.get("PYTHONPATH")]))}
    out = []
    for n in sizes:
        code = ("import json; from bench.memory import memory_child; "
                f"print(json.dumps(memory_child({model_name!r}, {cache_dir!r}, {n}, {shard_size}, {turns}, "
                f"{batch_size})))")
        proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, env=env)
        out.append(json.loads(proc.stdout.strip().splitlines()[-1]))
    return out
