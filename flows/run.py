"""What a flow body needs besides its stage calls: which stages run, and the summary of a run,
both read from the stages' manifests (so the flow body stays the pipeline diagram).

A stage runs when it is selected. A stage that is not selected but whose output a selected stage
needs is looked up in the store (`only_cached`): its stored manifest is used, and a missing one
fails the run with a message naming the stage. Other stages are skipped. A stage named in
`config.force` is selected and recomputed even when the store holds a usable output of it.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from race_core.config import PipelineConfig
from tasks.declarations import STAGES
from tasks.summary import summarize

# stage -> the stages whose output it reads, as declared (sample also reads the previous rl iteration's policy)
NEEDS: dict[str, tuple[str, ...]] = {name: stage.needs for name, stage in STAGES.items()}


def needed_stages(stages: tuple[str, ...] | list[str], rl_iterations: int) -> set[str]:
    """The selected stages and every stage whose output they read."""
    needed: set[str] = set()
    todo = list(stages)
    while todo:
        stage = todo.pop()
        if stage in needed:
            continue
        needed.add(stage)
        todo.extend(NEEDS[stage])
        if stage == "sample" and rl_iterations > 1:
            todo.append("rl")
    return needed


class PipelineRun:
    """Runs (or looks up, or skips) each stage of one pipeline run and keeps its manifest."""

    def __init__(self, config: PipelineConfig, earlier: dict[str, dict[str, Any]] | None = None):
        self.config = config
        self.forced = set(config.force) - {"validate"}  # validate is a check: nothing stored, it always runs
        self.selected = set(config.stages) | self.forced
        self.needed = needed_stages(tuple(self.selected), config.rl.iterations)
        self.manifests: dict[str, dict[str, Any]] = dict(earlier or {})

    def stage(self, stage: str, task: Callable[..., dict[str, Any]], *args: Any, label: str | None = None,
              **kwargs: Any) -> dict[str, Any] | None:
        """Run `task` if `stage` is selected, look its output up if a selected stage needs it, else None.
        The manifest is recorded under `label` (default: the stage name)."""
        if stage not in self.needed:
            return None
        if stage in self.selected:
            manifest = task(*args, **({"force": True} if stage in self.forced else {}), **kwargs)
        else:  # look up only: no task run, no retries
            manifest = task.fn(*args, only_cached=True, **kwargs)
        self.manifests[label or stage] = manifest
        return manifest

    def summary(self, run_info: dict[str, Any] | None = None) -> dict[str, Any]:
        """The run's summary (summary.json), from the manifests (`tasks.summary`)."""
        return summarize(self.manifests, run_info)
