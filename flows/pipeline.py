"""The RACE pipeline flow: its body is the stage list of DESIGN §8.

ingest -> validate -> score -> decide -> SFT -> (sample on-policy -> RL) x iterations -> evaluate
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from prefect import flow, get_run_logger

from race_core.tiny import checkpoint_digest
from tasks import pipeline_tasks as t

COVER_STAGES = ("ingest", "validate", "score", "decide")
TRAINING_STAGES = ("sft", "sample", "rl", "evaluate")
ALL_STAGES = COVER_STAGES + TRAINING_STAGES
BACKENDS = ("hf", "vllm")


def check_parameters(inputs: list[str], checkpoint: str, backend: str, epsilon: float, stages: list[str],
                     rl_iterations: int, device: str) -> None:
    """Fail early, naming the bad parameter."""
    if not inputs:
        raise ValueError("parameter 'inputs': give at least one JSONL file, glob or URL")
    if backend not in BACKENDS:
        raise ValueError(f"parameter 'backend': {backend!r} is not one of {BACKENDS}")
    if not (0 <= epsilon < 10):
        raise ValueError(f"parameter 'epsilon': {epsilon} is outside [0, 10)")
    unknown = sorted(set(stages) - set(ALL_STAGES))
    if unknown:
        raise ValueError(f"parameter 'stages': unknown {unknown}; known stages are {list(ALL_STAGES)}")
    if rl_iterations < 0:
        raise ValueError("parameter 'rl_iterations' must be >= 0")
    if not device.startswith(("cpu", "cuda")):
        raise ValueError(f"parameter 'device': {device!r} is not cpu or cuda[:N]")
    if not (Path(checkpoint) / "config.json").exists():
        raise ValueError(f"parameter 'checkpoint': {checkpoint!r} is not a local save_pretrained folder")


@flow(name="race-pipeline", log_prints=True)
def race_pipeline(
    inputs: list[str],
    checkpoint: str,
    store: str = ".race/store",
    backend: str = "hf",
    device: str = "cpu",
    dtype: str = "float32",
    epsilon: float = 1e-3,
    seed: int = 0,
    rl_iterations: int = 1,
    stages: list[str] | None = None,
    strict: bool = False,
    batch_size: int = 16,
    early_reject: bool = False,
) -> dict[str, Any]:
    """Compress the input trajectories with the LoGiC cover, then train on them; returns the summary.
    `stages` limits what runs (default: all of ingest, validate, score, decide, sft, sample, rl,
    evaluate)."""
    stages = list(ALL_STAGES) if stages is None else stages
    check_parameters(inputs, checkpoint, backend, epsilon, stages, rl_iterations, device)
    logger = get_run_logger()
    summary: dict[str, Any] = {"stages": {}}

    def timed(name: str, future_fn, *args, **kwargs) -> dict[str, Any]:
        started = time.perf_counter()
        manifest = future_fn(*args, **kwargs)
        summary["stages"][name] = {"cached": bool(manifest.get("cached")),
                                   "wall_s": round(time.perf_counter() - started, 3)}
        return manifest

    model_digest = checkpoint_digest(checkpoint)
    ingested = timed("ingest", t.ingest_task, store, inputs)
    summary["trajectories"] = {"ingested": ingested["metrics"]["ingested"],
                               "rejected": ingested["metrics"]["rejected"]}
    t.validate_task(ingested, strict)
    trajectories = ingested["objects"]["trajectories"]
    if "score" not in stages:
        return summary
    config = {"epsilon": epsilon, "backend": backend, "dtype": dtype, "early_reject": early_reject}
    scored = timed("score", t.score_task, store, trajectories, ingested["metrics"]["ingested"], checkpoint,
                   model_digest, config, device=device, batch_size=batch_size)
    decided = timed("decide", t.decide_task, store, trajectories, scored["objects"]["decisions"], checkpoint,
                    model_digest, epsilon)
    summary["cover"] = {k: decided["metrics"][k] for k in
                        ("candidates", "removed", "reasoning_tokens_before", "reasoning_tokens_after")}
    summary["objects"] = {"rejects": ingested["objects"]["rejects"], "decisions": scored["objects"]["decisions"],
                          "compressed": decided["objects"]["compressed"]}
    logger.info("cover: %s", summary["cover"])
    return summary
