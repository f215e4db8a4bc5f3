"""`race cover`: ingest -> score -> decide without orchestration, then the Parquet files copied
to an output folder. Same stage functions (and so the same cache) as the Prefect flow."""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from race_core.tiny import TINY, checkpoint_digest, ensure_checkpoint
from storage import ArtifactStore
from tasks import stages

DEMO_DATASET_SIZE = 24
DEMO_DATASET_SEED = 7


@dataclass(frozen=True)
class CoverJob:
    inputs: list[str] | None = None  # None: a generated calculator dataset
    checkpoint: str | None = None  # None: the built-in tiny checkpoint
    epsilon: float = 1e-3
    backend: str = "hf"
    device: str = "cpu"
    dtype: str = "float32"
    batch_size: int = 16
    early_reject: bool = False
    store: str = ".race/store"
    strict: bool = False
    home: str = ".race"


def demo_inputs(home: Path, n: int = DEMO_DATASET_SIZE, seed: int = DEMO_DATASET_SEED) -> list[str]:
    """A small generated calculator dataset (scripted expert episodes) as JSONL."""
    from race_core.envs.expert import expert_dataset

    path = home / "data" / f"calculator-expert-{n}-{seed}.jsonl"
    if not path.exists():
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(".tmp")
        tmp.write_text("".join(json.dumps(t.to_dict()) + "\n" for t in expert_dataset(n, seed)))
        tmp.rename(path)
    return [str(path)]


def run_cover_job(job: CoverJob, out_dir: Path, log: Callable[[str], None] = print) -> dict[str, Any]:
    home = Path(job.home)
    inputs = job.inputs or demo_inputs(home)
    checkpoint = job.checkpoint or str(ensure_checkpoint(home / "checkpoints", TINY))
    store = ArtifactStore(job.store)
    timings: dict[str, Any] = {}

    def timed(name: str, fn, *args, **kwargs) -> dict[str, Any]:
        started = time.perf_counter()
        manifest = fn(*args, **kwargs)
        timings[name] = {"cached": manifest["cached"], "wall_s": round(time.perf_counter() - started, 3)}
        log(f"{name}: {'cached' if manifest['cached'] else 'done'} in {timings[name]['wall_s']:.1f}s")
        return manifest

    ingested = timed("ingest", stages.ingest, store, inputs, log=log)
    metrics = ingested["metrics"]
    if job.strict and metrics["rejected"]:
        raise ValueError(f"{metrics['rejected']} input line(s) rejected and --strict is set; "
                         "see rejects.parquet or run `race validate`")
    model_digest = checkpoint_digest(checkpoint)
    config = stages.CoverConfig(epsilon=job.epsilon, backend=job.backend, dtype=job.dtype,
                                early_reject=job.early_reject)
    resources = stages.ScoringResources(device=job.device, batch_size=job.batch_size)
    trajectories = ingested["objects"]["trajectories"]
    scored = timed("score", stages.score, store, trajectories, checkpoint, model_digest, config, resources, log=log)
    decided = timed("decide", stages.decide, store, trajectories, scored["objects"]["decisions"], checkpoint,
                    model_digest, job.epsilon, log=log)

    out_dir.mkdir(parents=True, exist_ok=True)
    for name, digest in [("rejects", ingested["objects"]["rejects"]),
                         ("decisions", scored["objects"]["decisions"]),
                         ("compressed", decided["objects"]["compressed"])]:
        store.get_file(digest, out_dir / f"{name}.parquet")
    _print_removals(out_dir, log)
    return {"stages": timings, "trajectories": {"ingested": metrics["ingested"], "rejected": metrics["rejected"]},
            "cover": {k: decided["metrics"][k] for k in ("candidates", "removed", "reasoning_tokens_before",
                                                          "reasoning_tokens_after")},
            "model_digest": model_digest, "epsilon": job.epsilon, "out": str(out_dir)}


def _print_removals(out_dir: Path, log: Callable[[str], None], limit: int = 20) -> None:
    """Show what the cover removed: trajectory, turn, largest likelihood drop, tokens removed."""
    from storage.parquet import read_dataset

    decisions = read_dataset("decisions", out_dir / "decisions.parquet")
    accepted = decisions[decisions["accepted"]]
    log(f"removed reasoning in {len(accepted)} turn(s):")
    for row in accepted.head(limit).itertuples():
        log(f"  {row.trajectory_id[:12]} turn {row.turn}: max drop {row.max_drop:+.2e}, "
            f"{row.reasoning_tokens} reasoning tokens removed")
    if len(accepted) > limit:
        log(f"  ... and {len(accepted) - limit} more (decisions.parquet)")
