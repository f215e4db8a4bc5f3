"""The RACE pipeline flow: its body is the diagram of docs/architecture.md §8.

ingest -> validate -> cover -> compress -> sft -> (sample -> rl) x iterations -> evaluate -> report

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
from tasks import pipeline_tasks as t
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
    ingested = run.stage("ingest", t.ingest_task, store, list(cfg.inputs), cfg.ingest)
    run.stage("validate", t.validate_task, ingested, cfg.ingest)
    decided = run.stage("cover", t.cover_task, store, ingested, base, cfg.cover, cfg.resources)
    compressed = run.stage("compress", t.compress_task, store, ingested, decided, base, cfg.cover.epsilon)
    policy = tuned = run.stage("sft", t.sft_task, store, compressed, base, cfg.sft, cfg.resources)
    baseline = None
    if cfg.baseline and "sft" in run.selected:  # the no-removal arm: same SFT on the uncompressed trajectories
        run.manifests["arm_none"] = none = t.derived_arm_task(store, ingested, compressed, "none", base,
                                                              cfg.cover.epsilon)
        baseline = run.stage("sft", t.sft_task, store, none, base, cfg.sft, cfg.resources, label="sft_none")
    for i in range(cfg.rl.iterations):
        sampled = run.stage("sample", t.sample_task, store, policy, cfg.rl, cfg.resources, i, label=f"sample_{i}")
        policy = run.stage("rl", t.rl_task, store, policy, sampled, cfg.rl, cfg.cover.epsilon, cfg.resources, i,
                           label=f"rl_{i}")
    for label, evaluated in (("before", base), ("after_sft_none", baseline), ("after_sft", tuned),
                             ("after_rl", policy)):
        if evaluated is not None and (label != "after_rl" or evaluated is not tuned):
            run.stage("evaluate", t.evaluate_task, store, evaluated, cfg.evaluate, cfg.resources, label,
                      label=f"evaluate_{label}")
    summary = run.summary({**(run_info or {}), "model_digest": base.digest})
    if cfg.report_dir:
        t.report_task(store, summary, cfg.report_dir, cfg.cover.epsilon)
    return summary


@flow(name="race-pipeline", log_prints=True)
def race_pipeline(config: PipelineConfig) -> dict[str, Any]:
    """Compress the input trajectories with the LoGiC cover, then train on them; returns the summary.
    Every field of `config` is a parameter of the run (edit them in the UI before a run)."""
    return run_pipeline(config)
