"""Prefect deployments (DESIGN §8):

- `race-pipeline/manual`: the whole pipeline, every parameter editable in the UI before a run.
- `race-pipeline/nightly`: recompress what is new in an inbox, on a cron schedule (02:00 UTC).

`race serve` serves both to the Prefect server named by PREFECT_API_URL.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from race_core.cover import DEFAULT_EPSILON

NIGHTLY_CRON = "0 2 * * *"


@dataclass(frozen=True)
class DeploymentDefaults:
    inputs: tuple[str, ...] = ("data/*.jsonl",)
    inbox: str = "inbox/*.jsonl"
    checkpoint: str = ".race/checkpoints/policy"
    store: str = ".race/store"
    backend: str = "hf"
    device: str = "cpu"
    epsilon: float = DEFAULT_EPSILON
    cron: str = NIGHTLY_CRON
    timezone: str = "UTC"


def build_deployments(defaults: DeploymentDefaults = DeploymentDefaults()) -> list[Any]:
    from prefect.schedules import Cron

    from flows.nightly import race_nightly
    from flows.pipeline import race_pipeline

    manual = race_pipeline.to_deployment(
        name="manual",
        description="Run the RACE pipeline on your trajectories; edit the parameters before each run.",
        parameters={"inputs": list(defaults.inputs), "checkpoint": defaults.checkpoint, "store": defaults.store,
                    "backend": defaults.backend, "device": defaults.device, "epsilon": defaults.epsilon},
        tags=["race"],
    )
    nightly = race_nightly.to_deployment(
        name="nightly",
        description="Compress trajectories not yet compressed for this model and epsilon; appends a part.",
        schedules=[Cron(defaults.cron, timezone=defaults.timezone)],
        parameters={"inbox": defaults.inbox, "checkpoint": defaults.checkpoint, "store": defaults.store,
                    "backend": defaults.backend, "device": defaults.device, "epsilon": defaults.epsilon},
        tags=["race", "nightly"],
    )
    return [manual, nightly]


def serve_deployments(defaults: DeploymentDefaults = DeploymentDefaults(), limit: int | None = None) -> None:
    """Register both deployments with the server and run their flow runs here until stopped."""
    from prefect import serve

    serve(*build_deployments(defaults), limit=limit)
