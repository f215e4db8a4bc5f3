"""Training stages as plain functions (manifests in, manifests out): SFT on the compressed
trajectories, on-policy sampling in the calculator, the cover-aware RL update, and evaluation.

Each has an entry (`sft_stage`, ...: what its declaration in `tasks.declarations` names) taking the
manifests and policies of the stages before it as keyword arguments. A policy travels between stages as a `PolicyRef` (`tasks.policy_ref`): its model digest, and where
its files are (a checkpoint folder object in the store, or a local folder). Every stage loads its model with the `Resources` it is given (device, dtype).
"""

from __future__ import annotations

import json
import logging
from typing import Any

from race_core.config import EvalConfig, Resources, RLConfig, SFTConfig
from race_core.envs import get_environment
from storage import ArtifactStore
from tasks.base import _model_config, _rl_keyed, run_stage
from tasks.chunks import SampleJob, merge_chunks, sample_keyed, sample_scope  # noqa: F401 - sample_scope: re-exported
from tasks.executors import executor_for
from tasks.policy_ref import PolicyRef, materialize  # noqa: F401 - materialize: re-exported

logger = logging.getLogger(__name__)


def sft(store: ArtifactStore, compressed_digest: str, base: PolicyRef, config: SFTConfig, resources: Resources,
        only_cached: bool = False, force: bool = False) -> dict[str, Any]:
    """Fine-tune the base policy on the compressed trajectories (assistant tokens only), in this
    process or in launched training processes (`tasks.training_runs`)."""
    keyed, inputs = {**_model_config(config, resources), **resources.training_keyed()}, {"compressed": compressed_digest}

    def compute() -> dict[str, Any]:
        from tasks.training_runs import sft_compute, train_state_dir

        return sft_compute(store, compressed_digest, base, config, resources,
                           train_state_dir("sft", keyed, inputs, base.digest))

    return run_stage(store, "sft", keyed, inputs, base.digest, compute, only_cached, force)


def sample(store: ArtifactStore, policy: PolicyRef, config: RLConfig, resources: Resources, iteration: int,
           only_cached: bool = False, force: bool = False, sampler: Any = None) -> dict[str, Any]:
    """On-policy episodes of the current policy in its environment: K tasks × G rollouts, played in
    chunks of `config.sample_chunk` tasks (`tasks.chunks.SampleJob`) by the executor that
    `resources` names (`tasks.executors`), or in this process by `sampler`, a sampler that holds this
    very policy (an RL run's live one: `tasks.rl_run`), chunk after chunk with each chunk's seed."""
    keyed, inputs = sample_keyed(policy, config, resources, iteration)

    def compute() -> dict[str, Any]:
        from race_core.rollout import rollouts_to_json, sample_chunks, sample_rollouts

        if sampler is not None:
            rollouts = sample_rollouts(None, None, config, iteration, sampler=sampler)
        else:
            scope = sample_scope(policy, config, resources, iteration)
            job = SampleJob(policy, config, resources, iteration, scope)
            planned = [{"index": c} for c in range(len(sample_chunks(config)))]
            todo = [u for u in planned if force or job.committed(store, u) is None]
            if len(planned) > 1:
                logger.info(f"sample: iteration {iteration}: {len(planned)} chunk(s) of up to "
                            f"{config.sample_chunk or config.tasks_per_iteration} task(s); "
                            f"{len(planned) - len(todo)} committed before")
            if todo:
                executor_for(resources).run(job, todo, store, resources, force=force)
            rollouts = merge_chunks(store, scope, len(planned))
        digest = store.put_bytes(rollouts_to_json(rollouts).encode("utf-8"))
        successes = sum(r.success for r in rollouts)
        turns = sum(len(r.turns) for r in rollouts)
        reasoning = sum(r.reasoning_token_count() for r in rollouts)
        logger.info(f"sample: iteration {iteration}: {successes}/{len(rollouts)} rollouts succeeded")
        return {"objects": {"rollouts": digest},
                "metrics": {"rollouts": len(rollouts), "success_rate": successes / max(len(rollouts), 1),
                            "reasoning_tokens_per_turn": reasoning / max(turns, 1),
                            "generated_tokens": sum(sum(r.policy_mask) for r in rollouts)}}

    return run_stage(store, "sample", keyed, inputs, policy.digest, compute, only_cached, force)


def rl_update(store: ArtifactStore, policy: PolicyRef, rollouts_digest: str, config: RLConfig, epsilon: float,
              resources: Resources, iteration: int) -> dict[str, Any]:
    """One cover-aware RL update of the policy on its stored rollouts (cover at `epsilon` unless
    `config.epsilon` says), in this process or in launched training processes, with a fresh optimizer:
    the policy's manifest fields (its checkpoint put into the store) and the update's metrics. An RL
    run (`tasks.rl_run`) does its updates on a live trainer that keeps its optimizer instead; this is
    one update as the launched processes do it (`tasks.training_runs.rl_compute`)."""
    from tasks.training_runs import rl_compute, train_state_dir

    keyed = {**_rl_keyed(config, resources, iteration), "epsilon": epsilon, **resources.training_keyed()}
    inputs = {"policy": policy.folder or policy.digest, "rollouts": rollouts_digest}
    return rl_compute(store, policy, rollouts_digest, config, epsilon, resources,
                      train_state_dir("rl", keyed, inputs, policy.digest))


def evaluate(store: ArtifactStore, policy: PolicyRef, config: EvalConfig, resources: Resources, label: str = "",
             only_cached: bool = False, force: bool = False, sampler: Any = None) -> dict[str, Any]:
    """Greedy success rate, reasoning tokens per episode, skip ratio and reasoning tokens per thinking
    turn on held-out tasks; the episodes themselves as an `episodes` Parquet dataset (any later figure
    is computed from them without playing again). `sampler`: one that holds this very policy, of the
    config's backend (an RL run's live one), instead of a sampler built for the stage."""

    def compute() -> dict[str, Any]:
        from race_core.evaluate import evaluate_policy, heldout_tasks
        from race_core.sampling import make_sampler
        from storage.parquet import episode_row, write_dataset_to_store

        tasks = heldout_tasks(config.tasks, config.seed, shape=config.shape, env=config.env)
        model = tokenizer = None
        own = sampler
        if own is None and config.sampler == "hf":
            model, tokenizer = policy.load(store, resources)
        elif own is None:  # another backend over the same checkpoint (vllm): the process's engine
            own = make_sampler(config.sampler, policy.local_path(store), shared=True, device=resources.device,
                               dtype=resources.dtype, digest=policy.digest, **resources.sampler_options(config.sampler))
        try:
            report = evaluate_policy(model, tokenizer, tasks, greedy=True, seed=config.seed, max_turns=config.max_turns,
                                     max_new_tokens=config.max_new_tokens, sampler=own)
        finally:
            if own is not None and own is not sampler:
                own.close()
        summary = report.summary()
        logger.info(f"evaluate{(' ' + label) if label else ''}: success {summary['success_rate']:.1%} "
                    f"(± {summary['success_stderr']:.1%}), reasoning tokens per episode "
                    f"{summary['reasoning_tokens_per_episode']:.1f}, skip ratio {summary['skip_ratio']:.1%}")
        episodes, _ = write_dataset_to_store(store, "episodes", (episode_row(e, policy.digest) for e in report.episodes))
        digest = store.put_bytes(json.dumps(summary, sort_keys=True).encode())
        return {"objects": {"report": digest, "episodes": episodes}, "metrics": summary}

    return run_stage(store, "evaluate", _model_config(config, resources, greedy=True,
                                                      env_revision=get_environment(config.env).revision),
                     {}, policy.digest, compute, only_cached, force)


# -- the entries the declarations name (tasks.declarations) -------------------------------------
def sft_stage(store: ArtifactStore, *, compressed: dict[str, Any], base: PolicyRef | dict[str, Any],
              config: SFTConfig, resources: Resources, only_cached: bool = False,
              force: bool = False) -> dict[str, Any]:
    """The base policy fine-tuned on a compress (or arm) manifest's trajectories -> a policy."""
    return sft(store, compressed["objects"]["compressed"], PolicyRef.of(base), config, resources,
               only_cached=only_cached, force=force)


def sample_stage(store: ArtifactStore, *, policy: PolicyRef | dict[str, Any], iteration: int, config: RLConfig,
                 resources: Resources, only_cached: bool = False, force: bool = False) -> dict[str, Any]:
    """The policy's on-policy episodes of RL iteration `iteration` -> rollouts."""
    return sample(store, PolicyRef.of(policy), config, resources, iteration, only_cached=only_cached, force=force)


def evaluate_stage(store: ArtifactStore, *, policy: PolicyRef | dict[str, Any], label: str, config: EvalConfig,
                   resources: Resources, only_cached: bool = False, force: bool = False) -> dict[str, Any]:
    """The policy's held-out figures (`label` names it in the log and the summary artifact)."""
    return evaluate(store, PolicyRef.of(policy), config, resources, label, only_cached=only_cached, force=force)
