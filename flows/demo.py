"""`race demo`: the whole method on this machine, on embedded defaults.

bootstrap the demo policy (cached; the kinds expert's policy of `race ablate`, whose reasoning can
carry a result to a later turn) -> sample it in the calculator on two-part tasks, keep the
successful episodes as the RACE input JSONL -> the pipeline (cover, SFT on the compressed and, as
the no-removal baseline, on the unchanged trajectories, on-policy sampling, RL, evaluation before /
after SFT / after RL, report) inside this flow run, so the report is written once, by the
pipeline's report task, with the demo's own stages and run facts in it.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

from prefect import flow, get_run_logger, task
from prefect.cache_policies import NO_CACHE

from flows.pipeline import run_pipeline
from race_core.config import DEMO_CONFIG, PipelineConfig, Resources, replace
from race_core.policy import checkpoint_digest

DEMO_INPUT_TASKS = 128  # training tasks the bootstrap policy plays to make the RACE input
DEMO_INPUT_SAMPLES = 2  # episodes per task
DEMO_INPUT_TEMPERATURE = 0.7


@task(name="bootstrap", cache_policy=NO_CACHE, retries=1)
def bootstrap_task(home: str, kinds: bool = False) -> dict[str, Any]:
    """The demo policy: the DEMO tiny model fine-tuned on scripted expert episodes (cached); `kinds`:
    on the kinds expert's two-part episodes (`race_core.train.bootstrap.KINDS`, the ablation's)."""
    from race_core.train.bootstrap import KINDS, BootstrapConfig, ensure_bootstrap

    logger = get_run_logger()
    started = time.perf_counter()

    def progress(step: int, total: int, loss: float) -> None:
        if step == 1 or step % 50 == 0 or step == total:
            logger.info("bootstrap sft: step %d/%d loss %.4f", step, total, loss)

    result = ensure_bootstrap(Path(home) / "checkpoints", KINDS if kinds else BootstrapConfig(), progress=progress)
    return {"checkpoint": str(result.checkpoint), "cached": result.report is None,
            "wall_s": round(time.perf_counter() - started, 3)}


@task(name="demo-inputs", cache_policy=NO_CACHE, retries=1)
def demo_inputs_task(checkpoint: str, home: str, seed: int, tasks: int = DEMO_INPUT_TASKS,
                     shape: str = "random", difficulty: int | None = None, env: str = "calculator",
                     sampler: str = "hf", resources: Resources | None = None) -> dict[str, Any]:
    """Play the policy on training tasks; its successful episodes become the RACE input JSONL (none
    is an error: the policy does not play yet). `sampler`: hf (transformers) or vllm, on the device,
    dtype and engine options of `resources` (vLLM's episodes are its own draws: a file of its own)."""
    from race_core.policy import load_policy
    from race_core.rollout import sample_successful_trajectories

    started = time.perf_counter()
    samples, temperature = DEMO_INPUT_SAMPLES, DEMO_INPUT_TEMPERATURE
    digest = checkpoint_digest(checkpoint)[:16]
    kind = (("" if env == "calculator" else f"-{env}") + ("" if shape == "random" else f"-{shape}")
            + ("" if difficulty is None else f"-d{difficulty}") + ("" if sampler == "hf" else f"-{sampler}"))
    path = Path(home) / "demo" / f"inputs-{digest}-{tasks}x{samples}-{seed}-t{temperature:g}{kind}.jsonl"
    cached = path.exists()
    if not cached:
        if sampler == "hf":
            model, tokenizer = load_policy(checkpoint)
            trajectories, played = sample_successful_trajectories(model, tokenizer, tasks, samples, seed, temperature,
                                                                  shape, difficulty, env)
        else:
            trajectories, played = _successful_episodes_of(sampler, checkpoint, resources or Resources(), tasks,
                                                           samples, seed, temperature, shape, difficulty, env)
        if not trajectories:
            raise ValueError(f"policy {checkpoint}: none of its {played} episodes on {tasks} {env} training tasks "
                             "succeeded, and its own successful episodes are RACE's input: train it to play first "
                             "(race bootstrap: more expert episodes or steps, or easier tasks)")
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(".tmp")
        tmp.write_text("".join(json.dumps(t.to_dict()) + "\n" for t in trajectories))
        tmp.rename(path)
        get_run_logger().info("demo inputs: %d successful of %d episodes (%s) -> %s", len(trajectories), played,
                              sampler, path)
    return {"path": str(path), "cached": cached, "wall_s": round(time.perf_counter() - started, 3)}


def _successful_episodes_of(backend: str, checkpoint: str, resources: Resources, tasks: int, samples: int, seed: int,
                            temperature: float, shape: str, difficulty: int | None, env: str):
    """`race_core.rollout.sample_successful_trajectories`'s episodes played by another sampling backend
    (vLLM's) over the checkpoint, on the device, dtype and engine options of `resources`."""
    from race_core.envs import get_environment
    from race_core.rollout import play_episodes
    from race_core.sampling import SamplingParams, make_sampler

    drawn = get_environment(env).generate_tasks(tasks, seed, difficulty, split="train", shape=shape)
    sampler = make_sampler(backend, checkpoint, shared=True, device=resources.device, dtype=resources.dtype,
                           **resources.sampler_options(backend))
    try:
        rollouts = play_episodes(None, None, drawn, samples, SamplingParams(temperature=temperature, seed=seed),
                                 sampler=sampler)
    finally:
        sampler.close()
    trajectories = {t.id: t for r in rollouts if (t := r.to_trajectory()) is not None}
    return list(trajectories.values()), len(rollouts)


@flow(name="race-demo", log_prints=True)
def race_demo(home: str = ".race", out: str = "runs/demo", seed: int = 0,
              config: PipelineConfig = DEMO_CONFIG) -> dict[str, Any]:
    """bootstrap -> demo inputs -> the pipeline on them, with the report in OUT/report."""
    boot = bootstrap_task(home, kinds=True)
    inputs = demo_inputs_task(boot["checkpoint"], home, seed, shape="two-part")
    config = replace(config.with_seed(seed), inputs=(inputs["path"],), checkpoint=boot["checkpoint"],
                     store=str(Path(home) / "store"), report_dir=str(Path(out) / "report"))
    run_info = {"command": "race demo", "seed": seed, "inputs": inputs["path"], "store": config.store}
    return run_pipeline(config, run_info, earlier={"bootstrap": boot, "demo_inputs": inputs})
