"""Nightly recompression: new files from an inbox, only trajectories not yet compressed for this
(model, ε, scorer), one new Parquet part appended to the catalog."""

from __future__ import annotations

from typing import Any

from prefect import flow, get_run_logger

from race_core.cover import DEFAULT_EPSILON
from race_core.tiny import checkpoint_digest
from tasks import pipeline_tasks as t
from tasks.stages import expand_inputs


@flow(name="race-pipeline", flow_run_name="nightly-{inbox}", log_prints=True)
def race_nightly(
    inbox: str,
    checkpoint: str,
    store: str = ".race/store",
    backend: str = "hf",
    device: str = "cpu",
    dtype: str = "float32",
    epsilon: float = DEFAULT_EPSILON,
    batch_size: int = 16,
) -> dict[str, Any]:
    """Compress what is new in `inbox` (a glob or fsspec URL of JSONL files)."""
    logger = get_run_logger()
    files = expand_inputs([inbox])
    model_digest = checkpoint_digest(checkpoint)
    config = {"epsilon": epsilon, "backend": backend, "dtype": dtype, "early_reject": False}
    ingested = [t.ingest_task(store, [f]) for f in files]  # one per file: unchanged files are cached
    selected = t.select_new_task(store, [m["objects"]["trajectories"] for m in ingested], model_digest, config)
    summary: dict[str, Any] = {"files": len(files), "new": selected["metrics"]["new"],
                               "already_compressed": selected["metrics"]["already_compressed"]}
    if selected["metrics"]["new"] == 0:
        logger.info("nothing new: all %d trajectories in %s are already compressed for model %s at epsilon %g",
                    selected["metrics"]["seen"], inbox, model_digest[:12], epsilon)
        summary["part"] = None
        return summary
    trajectories = selected["objects"]["trajectories"]
    scored = t.score_task(store, trajectories, selected["metrics"]["new"], checkpoint, model_digest, config,
                          device=device, batch_size=batch_size)
    decided = t.decide_task(store, trajectories, scored["objects"]["decisions"], checkpoint, model_digest, epsilon)
    t.record_part_task(store, decided["objects"]["compressed"], selected["ids"], model_digest, config)
    summary.update(part=decided["objects"]["compressed"], decisions=scored["objects"]["decisions"],
                   scored_trajectories=scored["metrics"]["trajectories"],
                   removed=decided["metrics"]["removed"])
    logger.info("nightly: %d new trajectories compressed into part %s", summary["new"], summary["part"][:12])
    return summary
