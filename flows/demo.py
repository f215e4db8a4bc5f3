"""`race demo`: the whole method on this machine, on embedded defaults.

bootstrap the demo policy (cached) -> sample it in the calculator, keep the successful episodes as
the RACE input JSONL -> the pipeline flow (cover, SFT, on-policy sampling, RL, evaluation before /
after SFT / after RL) -> a report folder (report.md, plots, summary.json), also attached to the
flow run as artifacts.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from prefect import flow, get_run_logger, task
from prefect.cache_policies import NO_CACHE

from flows.pipeline import race_pipeline
from race_core.cover import DEFAULT_EPSILON
from race_core.tiny import checkpoint_digest


@dataclass(frozen=True)
class DemoDefaults:
    home: str = ".race"
    out: str = "runs/demo"
    seed: int = 0
    epsilon: float = DEFAULT_EPSILON
    input_tasks: int = 64  # training tasks the bootstrap policy plays to make the RACE input
    input_samples: int = 2  # episodes per task
    input_temperature: float = 0.7
    eval_tasks: int = 100
    rl_iterations: int = 1
    sft_epochs: int = 4
    sft_lr: float = 3e-4  # the policy is already trained; at 1e-3 its success fell 78% -> 65%
    rl_tasks: int = 8
    rl_group_size: int = 4
    rl_lr: float = 2e-5


@task(name="bootstrap", cache_policy=NO_CACHE, retries=1)
def bootstrap_task(home: str) -> dict[str, Any]:
    """The demo policy: the DEMO tiny model fine-tuned on scripted expert episodes (cached)."""
    from race_core.train.bootstrap import ensure_bootstrap

    logger = get_run_logger()
    started = time.perf_counter()

    def progress(step: int, total: int, loss: float) -> None:
        if step == 1 or step % 50 == 0 or step == total:
            logger.info("bootstrap sft: step %d/%d loss %.4f", step, total, loss)

    result = ensure_bootstrap(Path(home) / "checkpoints", progress=progress)
    return {"checkpoint": str(result.checkpoint), "cached": result.report is None,
            "wall_s": round(time.perf_counter() - started, 3)}


@task(name="demo-inputs", cache_policy=NO_CACHE, retries=1)
def demo_inputs_task(checkpoint: str, home: str, tasks: int, samples: int, seed: int,
                     temperature: float) -> dict[str, Any]:
    """Play the policy on training tasks; its successful episodes become the RACE input JSONL."""
    from race_core.train.onpolicy import sample_successful_trajectories

    started = time.perf_counter()
    digest = checkpoint_digest(checkpoint)[:16]
    path = Path(home) / "demo" / f"inputs-{digest}-{tasks}x{samples}-{seed}-t{temperature:g}.jsonl"
    cached = path.exists()
    if not cached:
        trajectories, played = sample_successful_trajectories(checkpoint, tasks, samples, seed, temperature)
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(".tmp")
        tmp.write_text("".join(json.dumps(t.to_dict()) + "\n" for t in trajectories))
        tmp.rename(path)
        get_run_logger().info("demo inputs: %d successful of %d episodes -> %s", len(trajectories), played, path)
    return {"path": str(path), "cached": cached, "wall_s": round(time.perf_counter() - started, 3)}


@flow(name="race-demo", log_prints=True)
def race_demo(home: str = ".race", out: str = "runs/demo", seed: int = 0,
              epsilon: float = DemoDefaults.epsilon) -> dict[str, Any]:
    d = DemoDefaults(home=home, out=out, seed=seed, epsilon=epsilon)
    boot = bootstrap_task(d.home)
    inputs = demo_inputs_task(boot["checkpoint"], d.home, d.input_tasks, d.input_samples, d.seed,
                              d.input_temperature)
    report_dir = str(Path(d.out) / "report")
    summary = race_pipeline(
        inputs=[inputs["path"]], checkpoint=boot["checkpoint"], store=str(Path(d.home) / "store"), seed=d.seed,
        epsilon=d.epsilon,
        rl_iterations=d.rl_iterations, sft_epochs=d.sft_epochs, sft_lr=d.sft_lr, rl_tasks=d.rl_tasks,
        rl_group_size=d.rl_group_size, rl_lr=d.rl_lr, eval_tasks=d.eval_tasks, report_dir=report_dir,
    )
    summary["stages"] = {"bootstrap": {"cached": boot["cached"], "wall_s": boot["wall_s"]},
                         "demo_inputs": {"cached": inputs["cached"], "wall_s": inputs["wall_s"]},
                         **summary["stages"]}
    summary["run"] = {"command": "race demo", "seed": d.seed, "policy_digest": checkpoint_digest(boot["checkpoint"]),
                      "inputs": inputs["path"], "store": str(Path(d.home) / "store")}
    from storage import ArtifactStore, read_dataset_from_store
    from tasks.report import write_report

    decisions = read_dataset_from_store(ArtifactStore(str(Path(d.home) / "store")), summary["objects"]["decisions"],
                                        "decisions")
    write_report(report_dir, summary, decisions)
    return summary
