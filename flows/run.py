"""What a flow body needs besides its stage calls: which stages run, and the summary of a run,
both read from the stages' manifests (so the flow body stays the pipeline diagram).

A stage runs when it is selected. A stage that is not selected but whose output a selected stage
needs is looked up in the store (`only_cached`): its stored manifest is used, and a missing one
fails the run with a message naming the stage. Other stages are skipped. A stage named in
`config.force` is selected and recomputed even when the store holds a usable output of it.

A stage is called by its name with the keyword inputs its declaration names (`tasks.declarations`);
the config sections it reads come from the run's config, so the flow body names only what flows
from stage to stage.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from race_core.config import PipelineConfig
from tasks.declarations import Stage, declared
from tasks.pipeline_tasks import stage_task
from tasks.summary import summarize


def needed_stages(stages: tuple[str, ...] | list[str]) -> set[str]:
    """The selected stages and every stage whose output they read (as declared). `sample` is the rl
    stage's: selecting it selects rl, which samples each of its iterations."""
    needed: set[str] = set()
    todo = [("rl" if stage == "sample" else stage) for stage in stages]
    while todo:
        stage = todo.pop()
        if stage in needed:
            continue
        needed.add(stage)
        todo.extend(declared(stage).needs)
    return needed


class PipelineRun:
    """Runs (or looks up, or skips) each stage of one pipeline run and keeps its manifest.
    `task_for(name)`: a stage's Prefect task (default `tasks.pipeline_tasks.stage_task`)."""

    def __init__(self, config: PipelineConfig, earlier: dict[str, dict[str, Any]] | None = None,
                 task_for: Callable[[str], Any] | None = None):
        self.config = config
        # validate is a check: nothing stored, it always runs; sample runs inside rl
        self.forced = {("rl" if stage == "sample" else stage) for stage in config.force} - {"validate"}
        self.selected = {("rl" if stage == "sample" else stage) for stage in (*config.stages, *self.forced)}
        if config.baseline and "sft" in self.selected:
            self.selected.add("arm")  # the no-removal arm the baseline SFT trains on
        self.needed = needed_stages(tuple(self.selected))
        self.manifests: dict[str, dict[str, Any]] = dict(earlier or {})
        self._task_for = task_for

    def sections(self, stage: Stage) -> dict[str, Any]:
        """The config sections `stage` reads, from this run's config: its own as `config`, the others by name."""
        own = {"config": getattr(self.config, stage.config)} if stage.config else {}
        return {**own, **{name: getattr(self.config, name) for name in stage.reads}}

    def stage(self, name: str, record_as: str | None = None, **inputs: Any) -> dict[str, Any] | None:
        """Run stage `name` on `inputs` if it is selected, look its output up if a selected stage needs it,
        else None. The manifest is recorded under `record_as` (default: the stage name). Inputs the
        declaration does not name, or a missing one, are a TypeError before anything runs."""
        stage = declared(name)
        arguments = {**self.sections(stage), **inputs}
        stage.check_arguments(arguments)
        if name not in self.needed:
            return None
        task = (self._task_for or stage_task)(name)
        if name in self.selected:
            manifest = task(self.config.store, **({"force": True} if name in self.forced else {}), **arguments)
        else:  # look up only: no task run, no retries
            manifest = task.fn(self.config.store, only_cached=True, **arguments)
        self.manifests[record_as or name] = manifest
        return manifest

    def summary(self, run_info: dict[str, Any] | None = None) -> dict[str, Any]:
        """The run's summary (summary.json), from the manifests (`tasks.summary`)."""
        return summarize(self.manifests, run_info)

