"""Nightly recompression: new files from an inbox, only trajectories not yet compressed for this
(model, ε, scorer), one new Parquet part appended to the catalog.

ingest (one per file) -> select new -> cover -> compress -> append part

An inbox glob that matches no file is "nothing new", not a failure. Rejected lines are reported as
in the manual pipeline: their count, and each file's `rejects` object (`race validate` lists them).
"""

from __future__ import annotations

from typing import Any

from prefect import flow, get_run_logger

from flows.roots import allowed_roots, check_within_roots
from race_core.config import NightlyConfig
from tasks.pipeline_tasks import record_part_task, select_new_task, stage_task
from tasks.stages import expand_inputs
from tasks.training_stages import PolicyRef


@flow(name="race-nightly", flow_run_name="nightly-{config.inbox}", log_prints=True)
def race_nightly(config: NightlyConfig) -> dict[str, Any]:
    """Compress what is new in `config.inbox` (a glob or fsspec URL of JSONL files)."""
    cfg, store = config.check(), config.store
    check_within_roots({"inbox": cfg.inbox, "checkpoint": cfg.checkpoint, "store": store}, allowed_roots())
    files = expand_inputs([cfg.inbox], allow_empty=True)
    summary: dict[str, Any] = {"files": len(files), "new": 0, "already_compressed": 0, "part": None,
                               "rejected": 0, "rejects": {}}
    if not files:
        get_run_logger().info("nothing new: %s matches no file", cfg.inbox)
        return summary
    base = PolicyRef.local(cfg.checkpoint)
    ingest = stage_task("ingest")
    ingested = {f: ingest(store, inputs=[f], config=cfg.ingest) for f in files}  # one per file: unchanged files are cached
    summary["rejects"] = {f: m["objects"]["rejects"] for f, m in ingested.items() if m["metrics"]["rejected"]}
    summary["rejected"] = sum(m["metrics"]["rejected"] for m in ingested.values())
    if summary["rejected"]:
        get_run_logger().warning("%d input line(s) rejected in %d file(s); each file's rejects object is in the "
                                 "summary", summary["rejected"], len(summary["rejects"]))
        if cfg.ingest.strict:
            raise ValueError(f"{summary['rejected']} input line(s) rejected and strict is set; rejects objects: "
                             f"{summary['rejects']}")
    selected = select_new_task(store, [m["objects"]["trajectories"] for m in ingested.values()], base.digest,
                               cfg.cover, cfg.resources)
    summary.update(new=selected["metrics"]["new"], already_compressed=selected["metrics"]["already_compressed"])
    if selected["metrics"]["new"] == 0:
        get_run_logger().info("nothing new: all %d trajectories in %s are already compressed for model %s at "
                              "epsilon %g", selected["metrics"]["seen"], cfg.inbox, base.digest[:12],
                              cfg.cover.epsilon)
        return summary
    decided = stage_task("cover")(store, trajectories=selected, policy=base, config=cfg.cover, resources=cfg.resources)
    compressed = stage_task("compress")(store, trajectories=selected, decided=decided, policy=base, config=cfg.cover)
    record_part_task(store, compressed["objects"]["compressed"], selected["ids"], base.digest, cfg.cover,
                     cfg.resources)
    summary.update(part=compressed["objects"]["compressed"], decisions=decided["objects"]["decisions"],
                   scored_trajectories=decided["metrics"]["trajectories"], removed=compressed["metrics"]["removed"])
    get_run_logger().info("nightly: %d new trajectories compressed into part %s", summary["new"],
                          summary["part"][:12])
    return summary
