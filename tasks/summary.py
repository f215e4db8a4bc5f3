"""A run's summary (summary.json) from its stages' manifests: per stage cached / wall time, the
trajectories ingested and refused, the cover's counts, the objects, the RL metrics, each training
stage's process count and step losses, and the evaluation by policy. One place for it: the flows and `race cover` both use it."""

from __future__ import annotations

from typing import Any

COVER_COUNTS = ("candidates", "removed", "reasoning_tokens_before", "reasoning_tokens_after")
TRAINING_FACTS = ("processes", "distributed_type", "mixed_precision", "gradient_checkpointing", "step_losses",
                  "grad_norms")


def summarize(manifests: dict[str, dict[str, Any]], run_info: dict[str, Any] | None = None) -> dict[str, Any]:
    """`manifests`: stage label -> manifest, in run order (`sft`, `rl`, `evaluate_before`, ...)."""
    m = manifests
    summary: dict[str, Any] = {
        "stages": {name: {"cached": bool(x["cached"]), "wall_s": x["wall_s"]} for name, x in m.items() if "cached" in x},
        "objects": {},
    }
    if run_info:
        summary["run"] = run_info
    if "ingest" in m:
        metrics = m["ingest"]["metrics"]
        too_long = m["cover"]["metrics"].get("too_long", 0) if "cover" in m else 0
        summary["trajectories"] = {"ingested": metrics["ingested"], "rejected": metrics["rejected"] + too_long,
                                   "too_long": too_long}
        summary["objects"]["rejects"] = m["ingest"]["objects"]["rejects"]
        summary["objects"]["trajectories"] = m["ingest"]["objects"]["trajectories"]  # the report's texts
    if "cover" in m:
        summary["objects"]["decisions"] = m["cover"]["objects"]["decisions"]
        if m["cover"]["objects"].get("rejects"):
            summary["objects"]["too_long"] = m["cover"]["objects"]["rejects"]
    if "compress" in m:
        summary["cover"] = {k: m["compress"]["metrics"][k] for k in COVER_COUNTS}
        if "cover" in m:
            summary["cover"].update({k: m["cover"]["metrics"].get(k) for k in ("scorer_noise", "render_mode", "work")})
        if "cross_turn" in m["compress"]["metrics"]:  # a compress stage stored before it counted them has none
            summary["cover"]["cross_turn"] = m["compress"]["metrics"]["cross_turn"]
        summary["objects"]["compressed"] = m["compress"]["objects"]["compressed"]
    if "sft" in m:
        summary["objects"]["sft_checkpoint"] = m["sft"]["objects"]["checkpoint"]
    if "rl" in m:  # the RL run: one manifest, its iterations' metrics and evaluations inside
        summary["rl"] = m["rl"]["metrics"]["iterations"]
        if m["rl"]["metrics"].get("evaluations"):
            summary["rl_evaluations"] = m["rl"]["metrics"]["evaluations"]
        summary["objects"]["rl_checkpoint"] = m["rl"]["objects"].get("checkpoint")
    training = {name: {k: x["metrics"][k] for k in TRAINING_FACTS if k in x["metrics"]}
                for name, x in m.items() if "step_losses" in x.get("metrics", {})}
    if training:  # per training stage (sft, sft_none, rl_0, ...): how many processes, every step's loss
        summary["training"] = training
    evals = {name.removeprefix("evaluate_"): x["metrics"] for name, x in m.items() if name.startswith("evaluate_")}
    if evals:
        summary["eval"] = evals
    return summary
