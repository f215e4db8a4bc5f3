"""The Prefect layer of the stages: one task per declared stage, made by `stage_task` from its
declaration (`tasks.declarations`, docs/architecture.md §8), and the tasks of the steps that are no
stage (nightly's select-new and catalog-append, the report).

A stage task is named after its stage, has the stage's retries and delay (none for a check, which
stores nothing) and the tag `gpu` for a stage that loads a model (concurrency limits by tag). It
calls the stage's entry with the store and the keyword arguments the declaration names, and returns
the stage manifest, a small JSON dict of digests and metrics; `only_cached=True` (a stage left out
of a run) returns the stored manifest or fails naming the stage; `force=True` recomputes even a
usable stored output (`race run --force STAGE`). Whether a stage runs at all is decided by its
storage stage key: a manifest under that key is the cached result (Prefect's own result cache is
off, so there is one source of truth, which survives a killed process and is shared with `race
cover`). Each stage that stores something publishes a markdown summary artifact; one that reports
progress (the cover) a progress artifact too. A stage logs to its modules' loggers, which Prefect
files under its task run (the project's packages are Prefect's extra loggers: `flows/__init__.py`).
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable
from typing import Any

from prefect import Task, task
from prefect.artifacts import (
    create_link_artifact,
    create_markdown_artifact,
    create_progress_artifact,
    create_table_artifact,
    update_progress_artifact,
)
from prefect.cache_policies import NO_CACHE

from race_core.config import CoverConfig, Resources
from race_core.memory import release_freed_memory
from race_core.progress import ProgressFigures
from storage import ArtifactStore
from tasks import stages
from tasks.declarations import Stage, declared

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


_TASKS: dict[str, Task] = {}


def stage_task(name: str) -> Task:
    """The Prefect task of the declared stage `name` (made once per process): called with the store's
    URL and the keyword arguments its declaration names (`Stage.arguments`), plus `only_cached` and
    `force`; returns the stage's manifest."""
    stage = declared(name)
    if name not in _TASKS or _TASKS[name].fn.stage is not stage:  # a stage declared again (a test's toy)
        _TASKS[name] = task(**stage_options(name))(_stage_run(stage))
    return _TASKS[name]


def _stage_run(stage: Stage) -> Callable[..., dict[str, Any]]:
    def run(store_url: str, only_cached: bool = False, force: bool = False, **arguments: Any) -> dict[str, Any]:
        stage.check_arguments(arguments)
        progress = _ProgressArtifact(stage.name, stage.progress) if stage.progress and not only_cached else None
        extra = {"on_progress": progress.publish} if progress else {}
        try:
            manifest = stage.function()(ArtifactStore(store_url), **arguments, only_cached=only_cached,
                                        force=force, **extra)
        finally:
            if stage.gpu:  # its peak (a training step, a batch's cache) is not the next stage's: with freed memory
                release_freed_memory()  # kept, a flow of many stages held its heap (an ablation's grew to 19.7 GB)
        if progress:
            progress.finish()
        if stage.key is not None:
            publish_summary(stage.artifact_name(arguments), manifest)
        return manifest

    run.__name__ = run.__qualname__ = f"{stage.name.replace('-', '_')}_task"  # Prefect's task key and run names
    run.__doc__ = stage.function().__doc__
    run.stage = stage  # type: ignore[attr-defined]
    return run


class _ProgressArtifact:
    """A stage's progress in the Prefect UI: the figures of the terminal bar / log lines."""

    def __init__(self, name: str, title: str):
        self.title = title
        self.id = create_progress_artifact(0.0, key=f"race-{name}-progress", description=f"{title}: starting")

    def publish(self, figures: ProgressFigures) -> None:  # or any figures with `fraction` and `summary()` (RL runs)
        update_progress_artifact(self.id, round(100 * figures.fraction, 1), description=f"{self.title}: {figures.summary()}")

    def finish(self) -> None:
        update_progress_artifact(self.id, 100.0)


@task(name="select-new", **RETRY, cache_policy=NO_CACHE)
def select_new_task(store_url: str, trajectories_digests: list[str], model_digest: str, config: CoverConfig,
                    resources: Resources) -> dict[str, Any]:
    manifest = stages.select_new(ArtifactStore(store_url), trajectories_digests, model_digest, config, resources)
    publish_summary("select-new", manifest)
    return manifest


@task(name="catalog-append", **RETRY, cache_policy=NO_CACHE)
def record_part_task(store_url: str, compressed_digest: str, ids: list[str], model_digest: str,
                     config: CoverConfig, resources: Resources) -> dict[str, Any]:
    return stages.record_part(ArtifactStore(store_url), compressed_digest, ids, model_digest, config, resources)


@task(name="report", **RETRY, cache_policy=NO_CACHE)
def report_task(store_url: str, summary: dict[str, Any], report_dir: str, cover: CoverConfig) -> dict[str, str]:
    """report.md, plots, summary.json and report.html in `report_dir`, also attached to the flow run;
    report.html is put in the store too, and the run links to it there."""
    from report.markdown import store_report, write_report
    from storage import read_dataset_from_store

    store = ArtifactStore(store_url)
    decisions_digest = summary.get("objects", {}).get("decisions")
    decisions = read_dataset_from_store(store, decisions_digest, "decisions") if decisions_digest else None
    written = write_report(report_dir, summary, decisions, cover.epsilon, store)
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
