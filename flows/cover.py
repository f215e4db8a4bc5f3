"""The cover half of the pipeline in this process, without Prefect (`race cover`): ingest ->
validate -> cover -> compress, then the Parquet files copied to an output folder, with the run's
report (`summary.json`, `report.md`, plots, `report.html`). The same stage functions (and so the
same store and cache) as the Prefect flow.

A damaged store does not stop it: a stage whose stored objects are missing or of the wrong size is
recomputed (`tasks.stages.run_stage`), and an object found corrupt when read is quarantined and the
stages are run once more, which recomputes the stage that produced it."""

from __future__ import annotations

import json
import logging
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pandas as pd

from race_core.config import COVER_STAGES, PipelineConfig, replace
from race_core.decisions import cross_turn_text
from race_core.policy import checkpoint_digest
from race_core.scoring import Scorer
from race_core.tiny import TINY, ensure_checkpoint
from report.markdown import write_report
from storage import ArtifactStore, CorruptObjectError, MissingObjectError
from storage.parquet import read_dataset, write_from_store
from tasks import stages
from tasks.summary import summarize

logger = logging.getLogger(__name__)

DEMO_DATASET_SIZE = 24
DEMO_DATASET_SEED = 7


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


def with_defaults(config: PipelineConfig, home: Path) -> PipelineConfig:
    """`config` with `race cover`'s defaults filled in: no inputs, a generated calculator dataset; no
    checkpoint, the built-in tiny one (both cached under `home`)."""
    return replace(config, inputs=tuple(config.inputs) or tuple(demo_inputs(home)),
                   checkpoint=config.checkpoint or str(ensure_checkpoint(home / "checkpoints", TINY)))


def run_cover(config: PipelineConfig, out_dir: Path, home: Path, scorer_factory: Callable[[], Scorer] | None = None
              ) -> dict[str, Any]:
    """The cover stages of `config` (no inputs: a generated calculator dataset; no checkpoint: the
    built-in tiny one; `config.force`: stages recomputed even when stored); returns the summary.
    `scorer_factory` gives the cover its scorer (default: one built from `config`; the ε sweep
    passes one that shares scores across ε)."""
    unknown = sorted(set(config.force) - set(COVER_STAGES))
    if unknown:
        raise ValueError(f"parameter 'force': {unknown} are not stages of race cover; its stages are "
                         f"{list(COVER_STAGES)}")
    config = with_defaults(config, home)
    inputs, checkpoint = list(config.inputs), config.checkpoint
    store = ArtifactStore(config.store)
    try:
        return _cover_stages(config, inputs, checkpoint, store, out_dir, scorer_factory)
    except (CorruptObjectError, MissingObjectError) as exc:
        logger.warning(f"{exc}; running the stages again now")
        return _cover_stages(config, inputs, checkpoint, store, out_dir, scorer_factory)


def _cover_stages(config: PipelineConfig, inputs: list[str], checkpoint: str, store: ArtifactStore, out_dir: Path,
                  scorer_factory: Callable[[], Scorer] | None) -> dict[str, Any]:
    manifests: dict[str, dict[str, Any]] = {}
    forced = set(config.force)

    def timed(name: str, manifest: dict[str, Any]) -> dict[str, Any]:
        manifests[name] = manifest
        logger.info(f"{name}: {'cached' if manifest['cached'] else 'done'} in {manifest['wall_s']:.1f}s")
        return manifest

    ingested = timed("ingest", stages.ingest(store, inputs, config.ingest, force="ingest" in forced))
    stages.validate(ingested, config.ingest)
    model_digest = checkpoint_digest(checkpoint)
    trajectories = ingested["objects"]["trajectories"]
    decided = timed("cover", stages.cover(store, trajectories, checkpoint, model_digest, config.cover,
                                          config.resources, scorer_factory=scorer_factory,
                                          force="cover" in forced))
    compressed = timed("compress", stages.compress(store, trajectories, decided["objects"]["decisions"], checkpoint,
                                                   model_digest, config.cover.epsilon,
                                                   refused_digest=decided["objects"]["rejects"],
                                                   force="compress" in forced))
    out_dir.mkdir(parents=True, exist_ok=True)
    for name, digest in [("decisions", decided["objects"]["decisions"]),
                         ("compressed", compressed["objects"]["compressed"])]:
        store.get_file(digest, out_dir / f"{name}.parquet")
    # every refused line or trajectory in one file: ingest's rejects, then the cover's too_long
    write_from_store(store, "rejects", [ingested["objects"]["rejects"], decided["objects"]["rejects"]],
                     out_dir / "rejects.parquet")
    decisions = read_dataset("decisions", out_dir / "decisions.parquet")
    _log_removals(decisions)
    if "cross_turn" in compressed["metrics"]:
        logger.info(f"cross-turn check: {cross_turn_text(compressed['metrics']['cross_turn'])}")
    run_info = {"command": "race cover", "inputs": inputs, "checkpoint": checkpoint, "store": store.url,
                "model_digest": model_digest, "epsilon": config.cover.epsilon, "backend": config.cover.backend}
    summary = {**summarize(manifests, run_info), "model_digest": model_digest, "epsilon": config.cover.epsilon,
               "out": str(out_dir)}
    written = write_report(out_dir, summary, decisions, config.cover.epsilon, store)
    logger.info(f"report: {written['html']} (report.md, plots and summary.json beside it)")
    return summary


def _log_removals(decisions: pd.DataFrame, limit: int = 20) -> None:
    """Log what the cover removed: trajectory, turn, largest likelihood drop, tokens removed."""
    accepted = decisions[decisions["accepted"]]
    logger.info(f"removed reasoning in {len(accepted)} turn(s):")
    for row in accepted.head(limit).itertuples():
        logger.info(f"  {row.trajectory_id[:12]} turn {row.turn}: max drop {row.max_drop:+.2e}, "
                    f"{row.reasoning_tokens} reasoning tokens removed")
    if len(accepted) > limit:
        logger.info(f"  ... and {len(accepted) - limit} more (decisions.parquet)")
