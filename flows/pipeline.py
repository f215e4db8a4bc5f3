"""The RACE pipeline flow: its body is the stage list of DESIGN §8.

ingest -> validate -> score -> decide -> SFT -> (sample on-policy -> RL) x iterations -> evaluate
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from prefect import flow, get_run_logger

from race_core.cover import DEFAULT_EPSILON
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
    epsilon: float = DEFAULT_EPSILON,
    seed: int = 0,
    rl_iterations: int = 1,
    stages: list[str] | None = None,
    strict: bool = False,
    batch_size: int = 16,
    early_reject: bool = False,
    sft_epochs: int = 1,
    sft_steps: int = 0,
    sft_lr: float = 1e-3,
    rl_tasks: int = 8,
    rl_group_size: int = 4,
    rl_lr: float = 1e-5,
    eval_tasks: int = 100,
    report_dir: str | None = None,
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

    policy_folder, policy_digest = None, model_digest
    if "sft" in stages:
        sft_config = {"epochs": sft_epochs, "steps": sft_steps, "lr": sft_lr, "seed": seed}
        tuned = timed("sft", t.sft_task, store, decided["objects"]["compressed"], checkpoint, model_digest, sft_config)
        policy_folder, policy_digest = tuned["objects"]["checkpoint"], tuned["policy_digest"]
        summary["objects"]["sft_checkpoint"] = policy_folder
    after_sft = (policy_folder, policy_digest)
    rl_ran = False
    if policy_folder and ("sample" in stages or "rl" in stages):
        rl_config = {"tasks_per_iteration": rl_tasks, "group_size": rl_group_size, "lr": rl_lr,
                     "epsilon": epsilon, "seed": seed}
        for iteration in range(rl_iterations):
            sampled = timed(f"sample_{iteration}", t.sample_task, store, policy_folder, policy_digest, rl_config,
                            iteration)
            if "rl" not in stages:
                break
            updated = timed(f"rl_{iteration}", t.rl_task, store, policy_folder, policy_digest,
                            sampled["objects"]["rollouts"], rl_config)
            policy_folder, policy_digest = updated["objects"]["checkpoint"], updated["policy_digest"]
            summary.setdefault("rl", []).append(updated["metrics"])
            rl_ran = True
        summary["objects"]["rl_checkpoint"] = policy_folder
    if "evaluate" in stages:
        summary["eval"] = {}
        points = [("before", checkpoint, None, model_digest)]
        if after_sft[0]:
            points.append(("after_sft", None, *after_sft))
        if rl_ran:  # (an update with all-equal rewards has no gradient: the same checkpoint)
            points.append(("after_rl", None, policy_folder, policy_digest))
        for label, local, folder, digest in points:
            evaluated = timed(f"evaluate_{label}", t.evaluate_task, store, local, folder, digest, eval_tasks, seed,
                              label)
            summary["eval"][label] = evaluated["metrics"]
    if report_dir:
        t.report_task(store, summary, report_dir, epsilon)
    return summary
