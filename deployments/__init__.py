"""Prefect deployments, declared (docs/architecture.md §8): what `race serve` registers, as data.

- `race-pipeline/manual`: the whole pipeline; its one parameter, the `PipelineConfig`, is a nested
  form in the UI, editable before each run.
- `race-nightly/nightly`: recompress what is new in an inbox, on a cron schedule (02:00 UTC). Its
  runs are serialized (a deployment concurrency limit of 1; a run started while one is running
  waits in the queue): two runs at once would both score what the catalog does not hold yet and
  append overlapping parts.
- `race-units/<pool>` (default pool `race-gpu`): a group of a stage's units (cover shards, sample
  chunks), run by a `race worker` of the process work pool `<pool>` as a child flow run of a stage
  whose resources name the pool (`flows.shard`, `tasks.executors.pool`). It is deployed by module
  entrypoint: workers run it from their installed package.

Each is a `Deployment`: the flow by its module entrypoint, never the flow object, so this package
names what is served without importing the flows; `flows.serve` (`race serve`) turns the
declarations into Prefect deployments, creates the pool and serves. The manual and nightly
deployments are instances of the configs in `race_core.config`: `declared(nightly)` derives the
manual run's defaults (checkpoint, store, ingest, cover, resources) from the nightly config.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

from race_core.config import NightlyConfig, PipelineConfig

NIGHTLY_CRON = "0 2 * * *"
DEFAULT_POOL = "race-gpu"
MANUAL_INPUTS = ("data/*.jsonl",)
SERVE_DEFAULTS = NightlyConfig(checkpoint=".race/checkpoints/policy")  # `race serve` without options


@dataclass(frozen=True)
class Deployment:
    """One deployment: `flow` is its flow's module entrypoint (`module:function`)."""

    flow: str
    name: str
    description: str
    tags: tuple[str, ...]
    parameters: dict[str, Any] = field(default_factory=dict)
    cron: str = ""  # a schedule, in `timezone` ("": runs only when started)
    timezone: str = "UTC"
    serialized: bool = False  # at most one run at a time; one started meanwhile waits in the queue


def manual_config(nightly: NightlyConfig) -> PipelineConfig:
    """The manual deployment's defaults: the nightly run's model, store and cover settings."""
    return PipelineConfig(inputs=MANUAL_INPUTS, checkpoint=nightly.checkpoint, store=nightly.store,
                          ingest=nightly.ingest, cover=nightly.cover, resources=nightly.resources)


def declared(nightly: NightlyConfig = SERVE_DEFAULTS, cron: str = NIGHTLY_CRON, timezone: str = "UTC") -> list[Deployment]:
    """The deployments `race serve` serves itself: the manual pipeline and the nightly recompression."""
    return [
        Deployment("flows.pipeline:race_pipeline", "manual",
                   "Run the RACE pipeline on your trajectories; edit the parameters before each run.", ("race",),
                   {"config": dataclasses.asdict(manual_config(nightly))}),
        Deployment("flows.nightly:race_nightly", "nightly",
                   "Compress trajectories not yet compressed for this model and epsilon; appends a part.",
                   ("race", "nightly"), {"config": dataclasses.asdict(nightly)}, cron=cron, timezone=timezone,
                   serialized=True),
    ]


def units_deployment(pool: str = DEFAULT_POOL) -> Deployment:
    """The child flow of a pool's stages, deployed to the work pool `pool` (under the pool's name)."""
    return Deployment("flows.shard:race_units", pool,
                      "Do a group of a stage's units (cover shards, sample chunks) on this worker's device (child "
                      "runs of a cover or sample stage).", ("race", "gpu"))
