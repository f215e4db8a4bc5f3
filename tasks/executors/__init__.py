"""Executors: where a stage's units of work run (docs/architecture.md §8 scale-out; datatrove's shape).

A stage declares its units as a `tasks.units.UnitJob` and hands the ones not committed yet to the
executor that `resources` names; the executor runs them and returns when every one is committed,
knowing nothing of what they are:

- `local`: in this process, one after another, one model loaded (`LocalExecutor`);
- `pool`: child flow runs of `race-units/<pool>` on a Prefect work pool, one `race worker` per
  device (`tasks.executors.pool`);
- `ray`: Ray actors, one per device, each keeping its model loaded across units
  (`tasks.executors.ray`, the `ray` extra).

The pool and Ray executors count a unit's tries themselves (`MAX_ATTEMPTS`); when a unit has failed
them all they raise `UnitsFailed`, which the stage's task does not retry
(`tasks.pipeline_tasks.worth_retrying`), so tries are counted once. The local executor counts none:
a unit that fails there fails the stage, and the stage's task retries it (its declared retries),
redoing only the units not committed yet. The executors are found by name (`EXECUTORS`), imported only when used.
"""

from __future__ import annotations

from collections.abc import Callable
from importlib import import_module
from typing import Any, Protocol

from race_core.config import Resources
from storage import ArtifactStore
from tasks.units import Unit, UnitJob

MAX_ATTEMPTS = 3  # tries of one unit (or one child run's group of units) before the stage fails

# name -> "module:class" (Resources.executor); "" is `pool` when resources.pool names one, else `local`
EXECUTORS: dict[str, str] = {
    "local": "tasks.executors:LocalExecutor",
    "pool": "tasks.executors.pool:PoolExecutor",
    "ray": "tasks.executors.ray:RayExecutor",
}


class UnitsFailed(RuntimeError):
    """Units that failed every try their executor gave them (or that no worker took)."""


class Executor(Protocol):
    def run(self, job: UnitJob, todo: list[Unit], store: ArtifactStore, resources: Resources, force: bool = False,
            on_progress: Callable[[Any], None] | None = None) -> None:
        """Do the units `todo` of `job`; return when every one is committed."""


def executor_name(resources: Resources) -> str:
    return resources.executor or ("pool" if resources.pool else "local")


def executor_for(resources: Resources) -> Executor:
    name = executor_name(resources)
    try:
        module, cls = EXECUTORS[name].split(":")
    except KeyError:
        raise ValueError(f"parameter 'resources.executor': {name!r} is not one of {sorted(EXECUTORS)}") from None
    return getattr(import_module(module), cls)()


class LocalExecutor:
    """The units in this process, in turn, with one worker (one model load)."""

    def run(self, job: UnitJob, todo: list[Unit], store: ArtifactStore, resources: Resources, force: bool = False,
            on_progress: Callable[[Any], None] | None = None) -> None:
        worker = job.worker(store, resources.device, on_progress, planned=todo)
        try:
            for unit in todo:
                worker.run(unit, force)
        finally:
            worker.close()
