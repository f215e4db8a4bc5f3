"""The RACE pipeline flow: its body is the diagram of docs/architecture.md §8.

ingest -> validate -> cover -> compress -> sft -> rl (sample -> update, x iterations) -> evaluate -> report

With `config.baseline`, the same SFT also runs on the trajectories as they came (the no-removal arm
of `race ablate`) and is evaluated beside the RACE policy (`after_sft_none`).

`config.stages` selects what runs; a stage left out that a selected one needs is read from the
store (or the run fails naming it), see `flows.run`.
"""

from __future__ import annotations

from typing import Any

from prefect import flow

from flows.roots import allowed_roots, check_within_roots
from flows.run import PipelineRun
from race_core.config import PipelineConfig
from tasks.pipeline_tasks import report_task
from tasks.training_stages import PolicyRef


def run_pipeline(config: PipelineConfig, run_info: dict[str, Any] | None = None,
                 earlier: dict[str, dict[str, Any]] | None = None) -> dict[str, Any]:
    """The pipeline's stages in order (inside a flow run); returns the run's summary. `earlier`:
    manifests of stages a calling flow ran before (shown in the summary)."""
    cfg, store = config.check(), config.store
    check_within_roots({"inputs": cfg.inputs, "checkpoint": cfg.checkpoint, "store": store,
                        "report_dir": cfg.report_dir}, allowed_roots())
    base = PolicyRef.local(cfg.checkpoint)
    run = PipelineRun(cfg, earlier)
    ingested = run.stage("ingest", inputs=list(cfg.inputs))
    run.stage("validate", ingested=ingested)
    decided = run.stage("cover", trajectories=ingested, policy=base)
    compressed = run.stage("compress", trajectories=ingested, decided=decided, policy=base)
    policy = tuned = run.stage("sft", compressed=compressed, base=base)
    baseline = None
    if cfg.baseline and "sft" in run.selected:  # the no-removal arm: same SFT on the uncompressed trajectories
        none = run.stage("arm", record_as="arm_none", trajectories=ingested, race=compressed, arm="none", policy=base)
        baseline = run.stage("sft", record_as="sft_none", compressed=none, base=base)
    if cfg.rl.iterations:  # the RL run: its iterations of sample -> update in one stage (tasks.rl_run)
        policy = run.stage("rl", policy=policy)
    for label, evaluated in (("before", base), ("after_sft_none", baseline), ("after_sft", tuned),
                             ("after_rl", policy)):
        if evaluated is not None and (label != "after_rl" or evaluated is not tuned):
            run.stage("evaluate", record_as=f"evaluate_{label}", policy=evaluated, label=label)
    summary = run.summary({**(run_info or {}), "model_digest": base.digest})
    if cfg.report_dir:
        report_task(store, summary, cfg.report_dir, cfg.cover)
    return summary


@flow(name="race-pipeline", log_prints=True)
def race_pipeline(config: PipelineConfig) -> dict[str, Any]:
    """Compress the input trajectories with the LoGiC cover, then train on them; returns the summary.
    Every field of `config` is a parameter of the run (edit them in the UI before a run)."""
    return run_pipeline(config)
