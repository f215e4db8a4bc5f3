"""Prefect tasks: one per stage, thin wrappers over `tasks.stages` (docs/architecture.md §8).

Each task has its own retries and delay; GPU stages carry the tag `gpu` (concurrency limits by
tag); both come from the stage's declaration (`tasks.declarations`). Tasks take the typed configs of `race_core.config` and return their stage manifest, a small
JSON dict of digests and metrics; `only_cached=True` (a stage left out of the run) returns the
stored manifest or fails naming the stage; `force=True` recomputes even a usable stored output
(`race run --force STAGE`). Whether a
stage runs at all is decided by its storage stage key: a manifest under that key is the cached
result (Prefect's own result cache is off, so there is one source of truth, which survives a killed
process and is shared with `race cover`). Each task publishes a markdown summary artifact.
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable
from dataclasses import replace
from typing import Any

from prefect import get_run_logger, task
from prefect.artifacts import (
    create_link_artifact,
    create_markdown_artifact,
    create_progress_artifact,
    create_table_artifact,
    update_progress_artifact,
)
from prefect.cache_policies import NO_CACHE

from race_core.config import CoverConfig, EvalConfig, IngestConfig, Resources, RLConfig, SFTConfig
from race_core.progress import ProgressFigures
from storage import ArtifactStore
from tasks import stages, training_stages
from tasks.declarations import declared
from tasks.training_stages import PolicyRef

RETRIES = int(os.environ.get("RACE_TASK_RETRIES", "2"))
RETRY_DELAY_S = float(os.environ.get("RACE_RETRY_DELAY_S", "5"))


def worth_retrying(task, task_run, state) -> bool:
    """Retry what may pass a second time (a lost connection, an object store that answers again),
    not what fails the same way every time: a bad parameter or input, a scorer too noisy for ε, a
    stage that was not run (ValueError, LookupError), a full, read-only or unwritable store
    (`StoreIOError.lasting`), nor units whose executor has spent their tries already
    (`tasks.executors.UnitsFailed`: tries are counted once)."""
    from tasks.executors import UnitsFailed

    return not isinstance(state.data, ValueError | LookupError | UnitsFailed) and not getattr(state.data, "lasting", False)


RETRY = {"retries": RETRIES, "retry_delay_seconds": RETRY_DELAY_S, "retry_condition_fn": worth_retrying}


def stage_options(name: str) -> dict[str, Any]:
    """A stage task's Prefect options from its declaration (`tasks.declarations`): its name, the
    `gpu` tag for a stage that loads a model, retries (none for a check, which stores nothing)."""
    stage = declared(name)
    return {"name": name, "tags": ["gpu"] if stage.gpu else [], "cache_policy": NO_CACHE,
            **(RETRY if stage.key is not None else {"retries": 0})}


def _logger_fn() -> Callable[[str], None]:
    logger = get_run_logger()
    return logger.info


def publish_summary(stage: str, manifest: dict[str, Any]) -> None:
    """A markdown table of the stage's metrics in the Prefect UI."""
    rows = "\n".join(f"| {k} | {v} |" for k, v in sorted(manifest.get("metrics", {}).items()))
    cached = "cached (no recompute)" if manifest.get("cached") else f"computed in {manifest.get('wall_s')} s"
    objects = "\n".join(f"- `{name}`: `{digest}`" for name, digest in sorted(manifest.get("objects", {}).items()))
    create_markdown_artifact(
        key=re.sub(r"[^a-z0-9-]+", "-", f"race-{stage}".lower()),  # Prefect's rule for artifact keys
        markdown=f"## {stage}: {cached}\n\n| metric | value |\n|---|---|\n{rows}\n\n**Objects**\n\n{objects}\n",
        description=f"RACE stage {stage}",
    )


def is_out_of_memory(exc: BaseException) -> bool:
    return isinstance(exc, MemoryError) or "out of memory" in str(exc).lower()


KV_BUDGET_FLOOR = 64 * 2**20  # out-of-memory retries do not halve the KV budget below this (64 MiB)


def with_oom_backoff(run: Callable[[Resources], dict[str, Any]], resources: Resources,
                     log: Callable[[str], None]) -> dict[str, Any]:
    """Run `run(resources)`; on out-of-memory halve what grows with the work, the batch size (down to
    1) and the hf scorer's KV budget (down to KV_BUDGET_FLOOR; an automatic one is first resolved on
    the memory free now), log both and run again. The error is raised when neither can shrink."""
    while True:
        try:
            return run(resources)
        except Exception as exc:  # noqa: BLE001 - only OOM is handled, everything else re-raised
            at_floor = resources.batch_size <= 1 and 0 < resources.kv_budget <= KV_BUDGET_FLOOR
            if not is_out_of_memory(exc) or at_floor:
                raise
        # past the except block, the failed run's frames and the memory they held are released
        _empty_cuda_cache()
        resources = _shrunk(resources, log)


def _shrunk(resources: Resources, log: Callable[[str], None]) -> Resources:
    from race_core.memory import automatic_kv_budget, format_size

    kv_budget = resources.kv_budget or automatic_kv_budget(resources.device)
    smaller = replace(resources, batch_size=max(1, resources.batch_size // 2),
                      kv_budget=min(kv_budget, max(KV_BUDGET_FLOOR, kv_budget // 2)))
    was = (format_size(kv_budget) if resources.kv_budget
           else f"automatic: half the free memory, {format_size(kv_budget)} now")
    log(f"out of memory: retrying with batch size {smaller.batch_size} (was {resources.batch_size}) and KV "
        f"budget {format_size(smaller.kv_budget)} (was {was})")
    return smaller


def _empty_cuda_cache() -> None:
    try:
        import torch

        if torch.cuda.is_available():
            torch.cuda.empty_cache()
    except ImportError:
        pass


@task(**stage_options("ingest"))
def ingest_task(store_url: str, inputs: list[str], config: IngestConfig, only_cached: bool = False,
                force: bool = False) -> dict[str, Any]:
    manifest = stages.ingest(ArtifactStore(store_url), inputs, config, log=_logger_fn(), only_cached=only_cached,
                             force=force)
    publish_summary("ingest", manifest)
    return manifest


@task(**stage_options("validate"))
def validate_task(ingested: dict[str, Any], config: IngestConfig) -> dict[str, Any]:
    return stages.validate(ingested, config)


@task(**stage_options("cover"))
def cover_task(store_url: str, trajectories: dict[str, Any], policy: PolicyRef, config: CoverConfig,
               resources: Resources, only_cached: bool = False, force: bool = False) -> dict[str, Any]:
    """The LoGiC cover (Algorithm 1) over the trajectories of an ingest (or select-new) manifest -> decisions."""
    log = _logger_fn()
    progress_id = create_progress_artifact(0.0, key="race-cover-progress", description="LoGiC cover: starting")

    def publish(figures: ProgressFigures) -> None:  # the figures of the terminal bar / log lines
        update_progress_artifact(progress_id, round(100 * figures.fraction, 1),
                                 description=f"LoGiC cover: {figures.summary()}")

    def run(sized: Resources) -> dict[str, Any]:
        store = ArtifactStore(store_url)
        return stages.cover(store, trajectories["objects"]["trajectories"], policy.local_path(store), policy.digest,
                            config, sized, log=log, only_cached=only_cached, force=force, on_progress=publish)

    manifest = with_oom_backoff(run, resources, log)
    update_progress_artifact(progress_id, 100.0)
    publish_summary("cover", manifest)
    return manifest


@task(**stage_options("compress"))
def compress_task(store_url: str, trajectories: dict[str, Any], decided: dict[str, Any], policy: PolicyRef,
                  epsilon: float, only_cached: bool = False, force: bool = False) -> dict[str, Any]:
    """Apply the cover's accepted removals -> compressed trajectories."""
    store = ArtifactStore(store_url)
    manifest = stages.compress(store, trajectories["objects"]["trajectories"],
                               decided["objects"]["decisions"], policy.local_path(store), policy.digest, epsilon,
                               log=_logger_fn(), only_cached=only_cached,
                               refused_digest=decided["objects"].get("rejects"), force=force)
    publish_summary("compress", manifest)
    return manifest


@task(name="select-new", **RETRY, cache_policy=NO_CACHE)
def select_new_task(store_url: str, trajectories_digests: list[str], model_digest: str, config: CoverConfig,
                    resources: Resources) -> dict[str, Any]:
    manifest = stages.select_new(ArtifactStore(store_url), trajectories_digests, model_digest, config, resources,
                                 log=_logger_fn())
    publish_summary("select-new", manifest)
    return manifest


@task(name="catalog-append", **RETRY, cache_policy=NO_CACHE)
def record_part_task(store_url: str, compressed_digest: str, ids: list[str], model_digest: str,
                     config: CoverConfig, resources: Resources) -> dict[str, Any]:
    return stages.record_part(ArtifactStore(store_url), compressed_digest, ids, model_digest, config, resources)


# -- training stages ---------------------------------------------------------------------------
@task(**stage_options("sft"))
def sft_task(store_url: str, compressed: dict[str, Any], base: PolicyRef, config: SFTConfig, resources: Resources,
             only_cached: bool = False, force: bool = False) -> dict[str, Any]:
    manifest = training_stages.sft(ArtifactStore(store_url), compressed["objects"]["compressed"], base, config,
                                   resources, log=_logger_fn(), only_cached=only_cached, force=force)
    publish_summary("sft", manifest)
    return manifest


@task(**stage_options("sample"))
def sample_task(store_url: str, policy: PolicyRef | dict[str, Any], config: RLConfig, resources: Resources,
                iteration: int, only_cached: bool = False, force: bool = False) -> dict[str, Any]:
    manifest = training_stages.sample(ArtifactStore(store_url), PolicyRef.of(policy), config, resources, iteration,
                                      log=_logger_fn(), only_cached=only_cached, force=force)
    publish_summary("sample", manifest)
    return manifest


@task(**stage_options("rl"))
def rl_task(store_url: str, policy: PolicyRef | dict[str, Any], sampled: dict[str, Any], config: RLConfig,
            epsilon: float, resources: Resources, iteration: int, only_cached: bool = False,
           force: bool = False) -> dict[str, Any]:
    manifest = training_stages.rl(ArtifactStore(store_url), PolicyRef.of(policy), sampled["objects"]["rollouts"],
                                  config, epsilon, resources, iteration, log=_logger_fn(), only_cached=only_cached,
                                  force=force)
    publish_summary("rl", manifest)
    return manifest


@task(**stage_options("evaluate"))
def evaluate_task(store_url: str, policy: PolicyRef | dict[str, Any], config: EvalConfig, resources: Resources,
                  label: str, only_cached: bool = False, force: bool = False) -> dict[str, Any]:
    manifest = training_stages.evaluate(ArtifactStore(store_url), PolicyRef.of(policy), config, resources, label,
                                        log=_logger_fn(), only_cached=only_cached, force=force)
    publish_summary(f"evaluate-{label.replace('_', '-')}", manifest)
    return manifest


@task(name="report", **RETRY, cache_policy=NO_CACHE)
def report_task(store_url: str, summary: dict[str, Any], report_dir: str, epsilon: float) -> dict[str, str]:
    """report.md, plots, summary.json and report.html in `report_dir`, also attached to the flow run;
    report.html is put in the store too, and the run links to it there."""
    from storage import read_dataset_from_store
    from tasks.report import store_report, write_report

    store = ArtifactStore(store_url)
    decisions_digest = summary.get("objects", {}).get("decisions")
    decisions = read_dataset_from_store(store, decisions_digest, "decisions") if decisions_digest else None
    written = write_report(report_dir, summary, decisions, epsilon, store)
    create_markdown_artifact(key="race-report", markdown=written["report"].read_text(),
                             description=f"RACE report ({report_dir})")
    stored = store_report(store, written["html"])
    create_link_artifact(key="race-report-html", link=stored, link_text="report.html",
                         description=f"the report as one page, in the store (a copy is in {report_dir})")
    evals = summary.get("eval", {})
    if evals:
        create_table_artifact(key="race-eval", table=[{"stage": k, **v} for k, v in evals.items()],
                              description="held-out evaluation by stage")
    return {**{k: str(v) for k, v in written.items()}, "stored_html": stored}


@task(**stage_options("arm"))
def derived_arm_task(store_url: str, trajectories: dict[str, Any], race: dict[str, Any], arm: str, policy: PolicyRef,
                     epsilon: float) -> dict[str, Any]:
    """The ablation's `arm` (none, random or all) version of the race arm's trajectories (`tasks.ablation`)."""
    from tasks.ablation import derived_arm

    store = ArtifactStore(store_url)
    manifest = derived_arm(store, trajectories["objects"]["trajectories"], race["objects"]["compressed"], arm,
                           policy.local_path(store), policy.digest, epsilon, log=_logger_fn())
    publish_summary(f"arm-{arm}", manifest)
    return manifest
