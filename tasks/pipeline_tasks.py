"""Prefect tasks: one per stage, thin wrappers over `tasks.stages` (DESIGN §8).

Each task has its own retries and delay; GPU stages carry the tag `gpu` (concurrency limits by
tag). A task's result is its stage manifest, a small JSON dict of digests and metrics. Whether a
stage runs at all is decided by its storage stage key: a manifest under that key is the cached
result (Prefect's own result cache is off, so there is one source of truth, which survives a killed
process and is shared with `race cover`). Each task publishes a markdown summary artifact.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any

from prefect import get_run_logger, task
from prefect.artifacts import (
    create_markdown_artifact,
    create_progress_artifact,
    create_table_artifact,
    update_progress_artifact,
)
from prefect.cache_policies import NO_CACHE

from storage import ArtifactStore
from tasks import stages, training_stages

RETRIES = int(os.environ.get("RACE_TASK_RETRIES", "2"))
RETRY_DELAY_S = float(os.environ.get("RACE_RETRY_DELAY_S", "5"))


def _logger_fn() -> Callable[[str], None]:
    logger = get_run_logger()
    return logger.info


def publish_summary(stage: str, manifest: dict[str, Any]) -> None:
    """A markdown table of the stage's metrics in the Prefect UI."""
    rows = "\n".join(f"| {k} | {v} |" for k, v in sorted(manifest.get("metrics", {}).items()))
    cached = "cached (no recompute)" if manifest.get("cached") else f"computed in {manifest.get('wall_s')} s"
    objects = "\n".join(f"- `{name}`: `{digest}`" for name, digest in sorted(manifest.get("objects", {}).items()))
    create_markdown_artifact(
        key=f"race-{stage}",
        markdown=f"## {stage}: {cached}\n\n| metric | value |\n|---|---|\n{rows}\n\n**Objects**\n\n{objects}\n",
        description=f"RACE stage {stage}",
    )


def is_out_of_memory(exc: BaseException) -> bool:
    return isinstance(exc, MemoryError) or "out of memory" in str(exc).lower()


def with_oom_backoff(run: Callable[[int], dict[str, Any]], batch_size: int, log: Callable[[str], None]
                     ) -> dict[str, Any]:
    """Run `run(batch_size)`; on out-of-memory halve the batch and try again, down to 1."""
    while True:
        try:
            return run(batch_size)
        except Exception as exc:  # noqa: BLE001 - only OOM is handled, everything else re-raised
            if not is_out_of_memory(exc) or batch_size <= 1:
                raise
            batch_size //= 2
            log(f"out of memory: retrying with batch size {batch_size}")
            try:
                import torch

                if torch.cuda.is_available():
                    torch.cuda.empty_cache()
            except ImportError:
                pass


@task(name="ingest", retries=RETRIES, retry_delay_seconds=RETRY_DELAY_S, cache_policy=NO_CACHE)
def ingest_task(store_url: str, inputs: list[str], max_field_chars: int = 1_000_000) -> dict[str, Any]:
    manifest = stages.ingest(ArtifactStore(store_url), inputs, stages.IngestConfig(max_field_chars=max_field_chars),
                             log=_logger_fn())
    publish_summary("ingest", manifest)
    return manifest


@task(name="validate", retries=0, cache_policy=NO_CACHE)
def validate_task(ingest_manifest: dict[str, Any], strict: bool) -> dict[str, Any]:
    """Gate before scoring: with `strict`, any rejected line fails the run here."""
    metrics = ingest_manifest["metrics"]
    if metrics["ingested"] == 0:
        raise ValueError("no valid trajectory in the input; see rejects.parquet (race validate lists them)")
    if strict and metrics["rejected"]:
        raise ValueError(f"{metrics['rejected']} input line(s) rejected and strict is set; "
                         "see rejects.parquet (race validate lists them)")
    return metrics


@task(name="score", retries=RETRIES, retry_delay_seconds=RETRY_DELAY_S, tags=["gpu"], cache_policy=NO_CACHE)
def score_task(store_url: str, trajectories_digest: str, trajectory_count: int, checkpoint: str,
               model_digest: str, config: dict[str, Any], device: str = "cpu", batch_size: int = 16,
               shard_size: int = 64) -> dict[str, Any]:
    log = _logger_fn()
    progress_id = create_progress_artifact(0.0, key="race-score-progress", description="LoGiC cover progress")

    def run(batch: int) -> dict[str, Any]:
        return stages.score(ArtifactStore(store_url), trajectories_digest, checkpoint, model_digest,
                            stages.CoverConfig(**config),
                            stages.ScoringResources(device=device, batch_size=batch, shard_size=shard_size),
                            log=log, trajectory_count=trajectory_count,
                            on_progress=lambda f: update_progress_artifact(progress_id, round(100 * f, 1)))

    manifest = with_oom_backoff(run, batch_size, log)
    update_progress_artifact(progress_id, 100.0)
    publish_summary("score", manifest)
    return manifest


@task(name="decide", retries=RETRIES, retry_delay_seconds=RETRY_DELAY_S, cache_policy=NO_CACHE)
def decide_task(store_url: str, trajectories_digest: str, decisions_digest: str, checkpoint: str,
                model_digest: str, epsilon: float) -> dict[str, Any]:
    manifest = stages.decide(ArtifactStore(store_url), trajectories_digest, decisions_digest, checkpoint,
                             model_digest, epsilon, log=_logger_fn())
    publish_summary("decide", manifest)
    return manifest


@task(name="select-new", retries=RETRIES, retry_delay_seconds=RETRY_DELAY_S, cache_policy=NO_CACHE)
def select_new_task(store_url: str, trajectories_digests: list[str], model_digest: str,
                    config: dict[str, Any]) -> dict[str, Any]:
    manifest = stages.select_new(ArtifactStore(store_url), trajectories_digests, model_digest,
                                 stages.CoverConfig(**config), log=_logger_fn())
    publish_summary("select-new", manifest)
    return manifest


@task(name="catalog-append", retries=RETRIES, retry_delay_seconds=RETRY_DELAY_S, cache_policy=NO_CACHE)
def record_part_task(store_url: str, compressed_digest: str, ids: list[str], model_digest: str,
                     config: dict[str, Any]) -> dict[str, Any]:
    return stages.record_part(ArtifactStore(store_url), compressed_digest, ids, model_digest,
                              stages.CoverConfig(**config))


# -- training stages ---------------------------------------------------------------------------
@task(name="sft", retries=RETRIES, retry_delay_seconds=RETRY_DELAY_S, tags=["gpu"], cache_policy=NO_CACHE)
def sft_task(store_url: str, compressed_digest: str, base_checkpoint: str, base_digest: str,
             config: dict[str, Any]) -> dict[str, Any]:
    from race_core.train.sft import SFTConfig

    manifest = training_stages.sft(ArtifactStore(store_url), compressed_digest, base_checkpoint, base_digest,
                                   SFTConfig(**config), log=_logger_fn())
    publish_summary("sft", manifest)
    return manifest


@task(name="sample", retries=RETRIES, retry_delay_seconds=RETRY_DELAY_S, tags=["gpu"], cache_policy=NO_CACHE)
def sample_task(store_url: str, policy_folder: str, policy_digest: str, config: dict[str, Any],
                iteration: int) -> dict[str, Any]:
    manifest = training_stages.sample(ArtifactStore(store_url), policy_folder, policy_digest, _rl_config(config),
                                      iteration, log=_logger_fn())
    publish_summary("sample", manifest)
    return manifest


@task(name="rl", retries=RETRIES, retry_delay_seconds=RETRY_DELAY_S, tags=["gpu"], cache_policy=NO_CACHE)
def rl_task(store_url: str, policy_folder: str, policy_digest: str, rollouts_digest: str,
            config: dict[str, Any]) -> dict[str, Any]:
    manifest = training_stages.rl(ArtifactStore(store_url), policy_folder, policy_digest, rollouts_digest,
                                  _rl_config(config), log=_logger_fn())
    publish_summary("rl", manifest)
    return manifest


@task(name="evaluate", retries=RETRIES, retry_delay_seconds=RETRY_DELAY_S, tags=["gpu"], cache_policy=NO_CACHE)
def evaluate_task(store_url: str, checkpoint: str | None, policy_folder: str | None, policy_digest: str,
                  tasks: int, seed: int, label: str) -> dict[str, Any]:
    store = ArtifactStore(store_url)
    local = checkpoint or training_stages.materialize(store, policy_folder)
    manifest = training_stages.evaluate(store, local, policy_digest, tasks, seed, log=_logger_fn(), label=label)
    publish_summary(f"evaluate-{label.replace('_', '-')}", manifest)
    return manifest


def _rl_config(config: dict[str, Any]):
    from race_core.train.rl import RLConfig

    return RLConfig(**config)


@task(name="report", retries=RETRIES, retry_delay_seconds=RETRY_DELAY_S, cache_policy=NO_CACHE)
def report_task(store_url: str, summary: dict[str, Any], report_dir: str, epsilon: float) -> dict[str, str]:
    """report.md, plots and summary.json in `report_dir`, also attached to the flow run."""
    from storage import read_dataset_from_store
    from tasks.report import write_report

    store = ArtifactStore(store_url)
    decisions_digest = summary.get("objects", {}).get("decisions")
    decisions = read_dataset_from_store(store, decisions_digest, "decisions") if decisions_digest else None
    written = write_report(report_dir, summary, decisions, epsilon)
    create_markdown_artifact(key="race-report", markdown=written["report"].read_text(),
                             description=f"RACE report ({report_dir})")
    evals = summary.get("eval", {})
    if evals:
        create_table_artifact(key="race-eval", table=[{"stage": k, **v} for k, v in evals.items()],
                              description="held-out evaluation by stage")
    return {k: str(v) for k, v in written.items()}
