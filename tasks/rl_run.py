"""The rl stage: a run of RL iterations from one policy, as one training run (docs/architecture.md §5, §8).

    policy_0 --(sample -> update)--> policy_1 --(sample -> update)--> ... --> policy_N

Iteration i samples the policy's rollouts (the `sample` stage, cached under its key, so arms that
start from the same policy share iteration 0's), updates the policy on them
(`race_core.train.rl.update_from_rollouts`) and commits a record `stages/rl-iteration/<scope>-<i>.json`:
the rollouts object, the new policy's digest, the update's metrics and the seconds of each phase.
Every `eval_every` iterations (and after the last) the new policy plays the held-out tasks (the
`evaluate` stage, cached under the policy's digest; iteration 0 is the starting policy).

What lives across iterations, in this process (`LiveRun`): the trainer's model and its optimizer
(AdamW's moments carry from one update to the next, as one training run), and the sampler: with
`rl.sampler = vllm` the process's one engine (`race_core.sampling.shared`: built once, by this run or
a stage before it, and kept for the stages after), given each new policy's weights in place
(`EngineOwner.load_weights`), serving the evaluations too; with `hf` the trainer's own model, which
is the policy. After each iteration the new policy's checkpoint and the optimizer's state are put
into the store and named by `stages/rl-resume/<scope>.json` (overwritten each iteration): a run that
stops anywhere resumes after its last committed iteration, from that state, bit for bit as an
uninterrupted run goes on (the engine is built once more). The state it replaces is removed from the
store unless a record keeps it: the last iteration's checkpoint is the stage's output, and
`keep_every` keeps every N-th (a checkpoint is the size of the model, an AdamW state twice that).

The scope (the run's key without `iterations`, `eval_every` and `keep_every`) names the records, so
asking the same run for more iterations continues it where it stopped instead of starting over.
A run's updates happen in launched training processes when `resources` asks for several
(`tasks.training_runs`): each iteration is one launch, its optimizer state handed over in files.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from race_core.config import CoverConfig, EvalConfig, Resources, RLConfig, key_fields
from storage import ArtifactStore, stage_key
from tasks.base import _model_config, run_stage
from tasks.declarations import declared
from tasks.executors import executor_name
from tasks.fingerprints import stage_code
from tasks.live_run import LiveRun
from tasks.policy_ref import PolicyRef

logger = logging.getLogger(__name__)

ITERATION_STAGE = "rl-iteration"
RESUME_STAGE = "rl-resume"
RUN_ONLY = ("iterations", "eval_every", "keep_every")  # fields that do not change what an iteration computes
# tests only: "I" raises right after iteration I's update, before anything is saved; "I:saved" after its
# state is written, before its record is committed
FAULT_ENV = "RACE_RL_FAULT"


class InjectedFault(RuntimeError):
    """The failure `FAULT_ENV` asks for (a test's run stopped part way through an iteration)."""


def run_keyed(config: RLConfig, epsilon: float, evaluate: EvalConfig, resources: Resources) -> dict[str, Any]:
    """The rl stage's keyed config: the RL settings, the cover's ε, the evaluation's when it evaluates."""
    keyed = {**_model_config(config, resources), "epsilon": config.epsilon if config.epsilon is not None else epsilon,
             **resources.training_keyed()}
    if config.eval_every:
        keyed["evaluate"] = key_fields(evaluate)
    return keyed


def run_scope(policy: PolicyRef, config: RLConfig, epsilon: float, resources: Resources) -> str:
    """The name of a run's iteration records: its key without the fields that only say how long it
    runs, how often it evaluates and what it keeps."""
    keyed = {k: v for k, v in run_keyed(config, epsilon, EvalConfig(), resources).items()
             if k not in (*RUN_ONLY, "evaluate")}
    inputs = {"policy": policy.folder or policy.digest}
    return stage_key("rl", declared("rl").version, keyed, inputs, policy.digest, stage_code("rl", keyed))


def iteration_record(scope: str, iteration: int) -> str:
    return f"stages/{ITERATION_STAGE}/{scope}-{iteration}.json"


def resume_record(scope: str) -> str:
    return f"stages/{RESUME_STAGE}/{scope}.json"


def committed_iterations(store: ArtifactStore, scope: str, limit: int) -> list[dict[str, Any]]:
    """The run's committed iteration records, 0, 1, ... up to the first one missing (at most `limit`)."""
    from tasks.units import usable

    records = []
    for i in range(limit):
        record = usable(store, iteration_record(scope, i))
        if record is None:
            break
        records.append(record)
    return records


@dataclass(frozen=True)
class RunProgress:
    """Where an RL run stands, for the UI's progress artifact (`tasks.pipeline_tasks`)."""

    iterations_done: int
    iterations_total: int
    elapsed_s: float
    last: str = ""  # the last iteration's figures

    @property
    def fraction(self) -> float:
        return self.iterations_done / self.iterations_total if self.iterations_total else 1.0

    def summary(self) -> str:
        left = ""
        if 0 < self.iterations_done < self.iterations_total:
            left = f", about {self.elapsed_s / self.iterations_done * (self.iterations_total - self.iterations_done) / 60:.0f} min left"
        return f"iteration {self.iterations_done} of {self.iterations_total}{left}" + (f"; {self.last}" if self.last else "")


def rl_run(store: ArtifactStore, policy: PolicyRef, config: RLConfig, epsilon: float, evaluate: EvalConfig,
           resources: Resources, only_cached: bool = False, force: bool = False,
           on_progress: Callable[[RunProgress], None] | None = None, live: bool = True) -> dict[str, Any]:
    """`config.iterations` RL iterations from `policy` (the module docstring) -> the last policy, with
    every iteration's metrics and the evaluations in the manifest's metrics. `on_progress` is called
    after each iteration. `live` off: every iteration and evaluation builds its sampler and loads its
    trainer again from the store, and rows of advantage 0 train too, as the pipeline ran before RL runs
    kept them (the same rollouts and policies, up to the float noise of a fresh engine; the baseline of
    `race bench rl --compare`)."""
    keyed = run_keyed(config, epsilon, evaluate, resources)
    inputs = {"policy": policy.folder or policy.digest}

    def compute() -> dict[str, Any]:
        scope = run_scope(policy, config, epsilon, resources)
        with LiveRun(store, policy, config, resources, keep=live) as run:
            return _iterate(store, scope, run, policy, config, epsilon, evaluate, resources, force, on_progress)

    return run_stage(store, "rl", keyed, inputs, policy.digest, compute, only_cached, force)


def _iterate(store: ArtifactStore, scope: str, live: LiveRun, start: PolicyRef, config: RLConfig, epsilon: float,
             evaluate: EvalConfig, resources: Resources, force: bool,
             on_progress: Callable[[RunProgress], None] | None) -> dict[str, Any]:
    from race_core.rollout import rollouts_from_json
    from tasks.training_stages import sample
    from tasks.units import commit_record, unit_provenance

    records = [] if force else committed_iterations(store, scope, config.iterations)
    state = _resume_state(store, scope, len(records)) if records else None
    usable = state is not None and state.get("iteration") == len(records) - 1 and store.manifest_damage(state) is None
    done = len(records) == config.iterations and "checkpoint" in (records[-1]["objects"] if records else {})
    # a longer run of this scope went on past the iterations asked for: its state is left as it is
    replay = state is not None and state.get("iteration", -1) >= len(records)
    current = start
    if done and not usable:  # every iteration asked for is committed (a longer run went on from the last)
        current = PolicyRef(digest=records[-1]["policy_digest"], folder=records[-1]["objects"]["checkpoint"])
        state = None
    elif records and not usable:
        if replay:
            logger.info(f"rl: a longer run went on past iteration {len(records)} without keeping its policy; "
                        f"playing its first {len(records)} iteration(s) again, its records and state left as they are")
        else:
            logger.warning(f"rl: {len(records)} iteration(s) committed but the state after the last is gone; "
                           "starting the run again from its first policy")
        records, state = [], None
    if state is not None:
        current = PolicyRef(digest=state["policy_digest"], folder=state["objects"]["checkpoint"])
        if len(records) < config.iterations:
            live.restore(current, state["objects"]["optimizer"])
            logger.info(f"rl: resuming after iteration {len(records)} of {config.iterations}")
    evaluations = _evaluations(store, live, records, start, current, config, evaluate, resources)
    here = executor_name(resources) == "local"  # else the sample chunks go to the pool's or Ray's workers
    began, resumed_at = time.perf_counter(), len(records)
    for i in range(len(records), config.iterations):
        started = time.perf_counter()
        live.phases.clear()
        if not live.keep and state is not None:  # the baseline: the trainer comes back from the store
            live.restore(current, state["objects"]["optimizer"])
        sampled = sample(store, current, config, resources, i, sampler=live.lazy_sampler(current, "sample") if here else None)
        sample_s = time.perf_counter() - started
        rollouts = rollouts_from_json(store.get_bytes(sampled["objects"]["rollouts"]).decode("utf-8"))
        report = live.update(rollouts, sampled["objects"]["rollouts"], i, epsilon)
        if os.environ.get(FAULT_ENV) == str(i):
            raise InjectedFault(f"{FAULT_ENV}={i}: stopped after the update of iteration {i}, before it was saved")
        at = time.perf_counter()
        new, optimizer = live.save(store)
        last = i + 1 == config.iterations
        keep = last or bool(config.keep_every and (i + 1) % config.keep_every == 0)
        previous = state
        state = {"iteration": i, "policy_digest": new.digest,
                 "objects": {"checkpoint": new.folder, "optimizer": optimizer}}
        if not replay:  # the state before it stays inside it until the iteration's record is committed
            store.write_record(resume_record(scope), {**state, "before": _bare(previous)}, overwrite=True)
        if os.environ.get(FAULT_ENV) == f"{i}:saved":
            raise InjectedFault(f"{FAULT_ENV}={i}:saved: stopped before iteration {i}'s record was committed")
        save_s = time.perf_counter() - at
        phases = {**live.phases, "sample": round(sample_s - live.phases.get("engine_start", 0.0)
                                                 - live.phases.get("weight_load", 0.0), 3),
                  **report["phases"], "checkpoint_write": round(save_s, 3)}
        metrics = {"iteration": i + 1, **report, "rollouts_object": sampled["objects"]["rollouts"],
                   "sampled_cached": bool(sampled["cached"]), "generated_tokens": sampled["metrics"].get("generated_tokens"),
                   "phases": phases, "seconds": round(time.perf_counter() - started, 3)}
        record = {"stage": ITERATION_STAGE, "key": f"{scope}-{i}", "iteration": i, "policy_digest": new.digest,
                  "objects": {"rollouts": sampled["objects"]["rollouts"], **({"checkpoint": new.folder} if keep else {})},
                  "metrics": metrics, **unit_provenance(resources.device)}
        commit_record(store, iteration_record(scope, i), record, force=force)
        records.append(record)
        if not replay and previous is not None:  # committed: the state before is no longer needed
            store.write_record(resume_record(scope), state, overwrite=True)
        if previous is not None:
            _discard(store, previous, records)
        live.forget(current)
        current = new
        logger.info(f"rl: iteration {i + 1}/{config.iterations}: {report['success_rate']:.0%} of {len(rollouts)} "
                    f"rollouts succeeded, loss {report['loss']:.4f}, {report['masked_tokens']} reasoning tokens masked, "
                    f"{report.get('skipped_rows', 0)} rows of advantage 0 left out, {metrics['seconds']:.0f} s")
        if _evaluated_at(i + 1, config) and (point := _evaluate(store, live, current, i + 1, evaluate, resources,
                                                                 config)) is not None:
            evaluations.append(point)
        if not live.keep:
            live.close()
        if on_progress is not None:
            on_progress(RunProgress(i + 1, config.iterations, (time.perf_counter() - began) * (i + 1) / (i + 1 - resumed_at),
                                    f"{report['success_rate']:.0%} of the rollouts won, loss {report['loss']:.4f}"))
    final = current  # the last iteration's policy (its checkpoint kept by the record or the resume state)
    return {"objects": {"checkpoint": final.folder} if final.folder else {}, "policy_digest": final.digest,
            "metrics": {"iterations": [r["metrics"] for r in records], "evaluations": evaluations,
                        "scope": scope, "engine_starts": live.engine_starts, **_totals(records)}}


def _evaluated_at(iteration: int, config: RLConfig) -> bool:
    """Whether the policy after `iteration` iterations (0: the starting one) plays the held-out tasks."""
    return bool(config.eval_every) and (iteration % config.eval_every == 0 or iteration == config.iterations)


def _evaluate(store: ArtifactStore, live: LiveRun, policy: PolicyRef, iteration: int, evaluate: EvalConfig,
              resources: Resources, config: RLConfig) -> dict[str, Any] | None:
    from tasks.base import StageNotRun
    from tasks.training_stages import evaluate as evaluate_stage

    sampler = live.lazy_sampler(policy, "evaluate") if evaluate.sampler == config.sampler and live.keep else None
    label = f"rl iteration {iteration}"
    try:
        evaluated = evaluate_stage(store, policy, evaluate, resources, label=label, sampler=sampler,
                                   only_cached=policy.folder is None and policy.path is None)
    except StageNotRun:
        logger.warning(f"rl: the policy after iteration {iteration} was not evaluated with these settings and its "
                       "checkpoint was not kept (rl.keep_every): its point is left out of the curve")
        return None
    return {"iteration": iteration, "policy_digest": policy.digest, "episodes_object": evaluated["objects"]["episodes"],
            "seconds": evaluated["wall_s"], **evaluated["metrics"]}


def _evaluations(store: ArtifactStore, live: LiveRun, records: list[dict[str, Any]], start: PolicyRef,
                 current: PolicyRef, config: RLConfig, evaluate: EvalConfig, resources: Resources
                 ) -> list[dict[str, Any]]:
    """The evaluations of the iterations done before this call (the start's, then every eval point):
    cached stages, but the last committed iteration's when the run stopped before evaluating it (its
    policy is `current`, the state the run resumes from), and an earlier one whose checkpoint was kept."""
    done = []
    for iteration in range(len(records) + 1):
        if not _evaluated_at(iteration, config):
            continue
        if iteration == 0:
            policy = start
        elif iteration == len(records):
            policy = current
        else:
            record = records[iteration - 1]
            policy = PolicyRef(digest=record["policy_digest"], folder=record["objects"].get("checkpoint"))
        point = _evaluate(store, live, policy, iteration, evaluate, resources, config)
        if point is not None:
            done.append(point)
    return done


def _totals(records: list[dict[str, Any]]) -> dict[str, Any]:
    """What the summary and the report read of the run as a whole: the last iteration's loss terms."""
    if not records:
        return {}
    last = records[-1]["metrics"]
    return {k: last[k] for k in ("loss", "actor_loss", "closure_loss", "masked_tokens", "closure_terms", "policy_tokens",
                                 "total_turns", "success_rate", "processes", "step_losses", "grad_norms") if k in last}


def _resume_state(store: ArtifactStore, scope: str, committed: int) -> dict[str, Any] | None:
    """The state a run resumes from after its `committed` iterations: the resume record, or the state
    it carries from before, where the run stopped between writing the one and committing the last
    iteration's record (which it then plays again)."""
    state = store.read_record(resume_record(scope))
    before = (state or {}).get("before")
    if (state is not None and state.get("iteration") == committed and before and before.get("iteration") == committed - 1
            and store.read_record(iteration_record(scope, committed)) is None):  # (else: a longer run's state)
        return before
    return state


def _bare(state: dict[str, Any] | None) -> dict[str, Any] | None:
    return None if state is None else {k: v for k, v in state.items() if k != "before"}


def _discard(store: ArtifactStore, previous: dict[str, Any], records: list[dict[str, Any]]) -> None:
    """Remove the superseded state's objects from the store, unless a record still reaches them (a
    kept iteration's checkpoint, files every checkpoint shares, another run's)."""
    from storage.gc import discard_unreferenced

    discard_unreferenced(store, previous["objects"].values())


def rl_run_stage(store: ArtifactStore, *, policy: PolicyRef | dict[str, Any], config: RLConfig, cover: CoverConfig,
                 evaluate: EvalConfig, resources: Resources, only_cached: bool = False, force: bool = False,
                 on_progress: Callable[[RunProgress], None] | None = None) -> dict[str, Any]:
    """The rl stage's entry (`tasks.declarations`): `config.iterations` RL iterations from a policy (an
    sft manifest, or a PolicyRef), the cover at `config.epsilon` or else the run's ε (`cover.epsilon`)."""
    return rl_run(store, PolicyRef.of(policy), config, cover.epsilon, evaluate, resources, only_cached=only_cached,
                  force=force, on_progress=on_progress)

