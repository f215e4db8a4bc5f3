"""`race ablate`: does the cross-turn check matter, and does RACE beat removing reasoning blindly?

bootstrap the kinds policy (`race_core.train.bootstrap.KINDS`, cached) -> its successful episodes of
two-part training tasks (the trajectories every arm is made from) -> the cover at ε twice (RACE,
and local-only) -> the five arms of `race_core.ablation` -> per arm and SFT seed: SFT the same
bootstrap policy, evaluate on the same held-out two-part tasks -> from each seed's RACE policy,
`rl.iterations` of cover-aware RL and, on the same rollout budget, of plain GRPO -> evaluate ->
`ablation.json`, `report.md`, `ablation.png` in OUT and as Prefect artifacts.

Every stage is cached in the store under its key, so a rerun computes nothing and an interrupted one
resumes at the first stage without a manifest.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from prefect import flow
from prefect.artifacts import create_markdown_artifact, create_table_artifact

from flows.demo import DEMO_INPUT_TASKS, bootstrap_task, demo_inputs_task
from race_core.ablation import COVER_ARMS, DERIVED_ARMS
from race_core.config import CoverConfig, EvalConfig, PipelineConfig, RLConfig, SFTConfig, replace
from tasks import pipeline_tasks as t
from tasks.training_stages import PolicyRef

ABLATE_INPUT_TASKS = DEMO_INPUT_TASKS  # two-part training tasks the policy plays (2 episodes each): the demo's
ABLATE_SEEDS = (0, 1, 2)
ABLATE_CONFIG = PipelineConfig(
    cover=CoverConfig(epsilon=1e-3),
    sft=SFTConfig(epochs=4, lr=3e-4),
    rl=RLConfig(iterations=12, tasks_per_iteration=16, group_size=4, lr=2e-4, shape="two-part"),
    evaluate=EvalConfig(tasks=200, shape="two-part"),
)


def _metrics(evaluated: dict[str, Any], policy: PolicyRef | dict[str, Any]) -> dict[str, Any]:
    m = evaluated["metrics"]
    return {"success_rate": m["success_rate"], "reasoning_tokens_per_episode": m["reasoning_tokens_per_episode"],
            "turns_per_episode": m["turns_per_episode"], "policy_digest": PolicyRef.of(policy).digest}


@flow(name="race-ablate", log_prints=True)
def race_ablate(home: str = ".race", out: str = "runs/ablate", seeds: tuple[int, ...] = ABLATE_SEEDS,
                input_tasks: int = ABLATE_INPUT_TASKS, config: PipelineConfig = ABLATE_CONFIG) -> dict[str, Any]:
    """Five arms x `seeds` SFT runs, then cover-aware RL vs plain GRPO from each seed's RACE policy.
    `config.checkpoint` / `config.inputs`, when given, replace the kinds bootstrap policy / its sampled
    episodes (a smaller policy or other trajectories; the kinds are read from the reasoning text)."""
    from tasks.ablation import write_ablation

    started = time.perf_counter()
    store, resources, eps = str(Path(home) / "store"), config.resources, config.cover.epsilon
    checkpoint = config.checkpoint or bootstrap_task(home, kinds=True)["checkpoint"]
    base = PolicyRef.local(checkpoint)
    paths = list(config.inputs) or [demo_inputs_task(checkpoint, home, 0, tasks=input_tasks, shape="two-part")["path"]]
    ingested = t.ingest_task(store, paths, config.ingest)
    manifests = [ingested]
    t.validate_task(ingested, config.ingest)
    compressed: dict[str, dict[str, Any]] = {}
    for arm, local_only in COVER_ARMS.items():
        decided = t.cover_task(store, ingested, base, replace(config.cover, local_only=local_only), resources)
        compressed[arm] = t.compress_task(store, ingested, decided, base, eps)
        manifests += [decided, compressed[arm]]
    for arm in DERIVED_ARMS:
        compressed[arm] = t.derived_arm_task(store, ingested, compressed["race"], arm, base, eps)
    before = t.evaluate_task(store, base, config.evaluate, resources, "before")
    manifests += [before, *(compressed[arm] for arm in DERIVED_ARMS)]
    arms: list[dict[str, Any]] = []
    race_policies: dict[int, dict[str, Any]] = {}
    for arm in ("none", "race", "local", "random", "all"):
        for seed in seeds:
            policy = t.sft_task(store, compressed[arm], base, replace(config.sft, seed=seed), resources)
            evaluated = t.evaluate_task(store, policy, config.evaluate, resources, f"{arm} seed {seed}")
            manifests += [policy, evaluated]
            arms.append({"arm": arm, "seed": seed, **_metrics(evaluated, policy)})
            if arm == "race":
                race_policies[seed] = policy
    every = max(1, config.rl.iterations // 4)
    if config.rl.iterations:
        for entry in (e for e in arms if e["arm"] == "race"):
            for phase, cover_aware in (("rl", True), ("grpo", False)):
                rl = replace(config.rl, seed=entry["seed"], cover_aware=cover_aware)
                policy: Any = race_policies[entry["seed"]]
                curve = []  # greedy held-out figures every `every` iterations: when does the policy move?
                for i in range(rl.iterations):
                    sampled = t.sample_task(store, policy, rl, resources, i)
                    policy = t.rl_task(store, policy, sampled, rl, eps, resources, i)
                    manifests += [sampled, policy]
                    if (i + 1) % every == 0 or i + 1 == rl.iterations:
                        evaluated = t.evaluate_task(store, policy, config.evaluate, resources,
                                                    f"race+{phase} seed {entry['seed']} iteration {i + 1}")
                        manifests.append(evaluated)
                        curve.append({"iteration": i + 1, **_metrics(evaluated, policy)})
                entry[phase] = {**curve[-1], "curve": curve, "moved_after": _moved_after(entry, curve)}
    result = {
        "arms": arms,
        "before": _metrics(before, base),
        "removed_by_kind": _removed_by_kind(store, ingested, compressed),
        "training": {arm: compressed[arm]["metrics"] for arm in compressed},
        "compressed": {arm: compressed[arm]["objects"]["compressed"] for arm in compressed},  # each arm's Parquet
        "computed": sum(not m["cached"] for m in manifests),  # stages computed by this run (0: all cached)
        "run": {"command": f"race ablate --out {out}", "seeds": list(seeds), "epsilon": eps,
                "policy_digest": base.digest, "inputs": paths, "store": store,
                "rl_iterations": config.rl.iterations,
                "rollouts_per_iteration": config.rl.tasks_per_iteration * config.rl.group_size,
                "eval_tasks": config.evaluate.tasks, "wall_s": round(time.perf_counter() - started, 1)},
    }
    written = write_ablation(out, result)
    create_markdown_artifact(key="race-ablation", markdown=written["report"].read_text(),
                             description=f"RACE ablation ({out})")
    create_table_artifact(key="race-ablation-arms", description="success and reasoning tokens per arm and seed",
                          table=[{k: v for k, v in e.items() if k not in ("rl", "grpo")} for e in arms])
    return result


def _moved_after(start: dict[str, Any], curve: list[dict[str, Any]]) -> int | None:
    """The first evaluated iteration whose greedy figures differ from the SFT policy's (None: never)."""
    same = ("success_rate", "reasoning_tokens_per_episode", "turns_per_episode")
    return next((c["iteration"] for c in curve if any(c[k] != start[k] for k in same)), None)


def _removed_by_kind(store: str, ingested: dict[str, Any], compressed: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """Share of each reasoning kind that each arm removed (read from the stored manifests)."""
    from storage import ArtifactStore
    from tasks.ablation import kind_shares

    return kind_shares(ArtifactStore(store), ingested["objects"]["trajectories"],
                       {arm: m["objects"]["compressed"] for arm, m in compressed.items()})
