"""Training stages as plain functions (manifests in, manifests out): SFT on the compressed
trajectories, on-policy sampling in the calculator, the cover-aware RL update, and evaluation.

A policy travels between stages as a `PolicyRef`: its model digest, and where its files are (a
checkpoint folder object in the store, or a local folder). `PolicyRef.local_path` restores a
stored one to a local cache folder (by digest, verified) so transformers can load it with
`from_pretrained`. Every stage loads its model with the `Resources` it is given (device, dtype).
"""

from __future__ import annotations

import json
import os
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from race_core.config import EvalConfig, Resources, RLConfig, SFTConfig, key_fields
from race_core.envs.calculator import ENV_REVISION
from race_core.policy import checkpoint_digest
from storage import ArtifactStore, put_checkpoint, restore_checkpoint, stage_key
from tasks.fingerprints import stage_code
from tasks.stages import Log, _quiet, run_stage

CACHE_ENV = "RACE_CHECKPOINT_CACHE"


def checkpoint_cache() -> Path:
    return Path(os.environ.get(CACHE_ENV, Path(".race") / "cache" / "checkpoints"))


def materialize(store: ArtifactStore, folder_digest: str) -> str:
    """A local folder holding the checkpoint object `folder_digest` (restored once, verified)."""
    dest = checkpoint_cache() / folder_digest
    if not (dest / ".complete").exists():
        restore_checkpoint(store, folder_digest, dest)
        (dest / ".complete").write_text(folder_digest)
    return str(dest)


@dataclass(frozen=True)
class PolicyRef:
    """A policy checkpoint: `digest` identifies the model (its files); `folder` is the digest of its
    checkpoint folder object in the store, `path` a local save_pretrained folder (one of the two)."""

    digest: str
    folder: str | None = None
    path: str | None = None

    @classmethod
    def local(cls, path: str | Path) -> PolicyRef:
        return cls(digest=checkpoint_digest(path), path=str(path))

    @classmethod
    def of(cls, policy: PolicyRef | dict[str, Any]) -> PolicyRef:
        """A PolicyRef as is, or the policy that a training stage's manifest (sft, rl) produced."""
        if isinstance(policy, PolicyRef):
            return policy
        return cls(digest=policy["policy_digest"], folder=policy["objects"]["checkpoint"])

    def local_path(self, store: ArtifactStore) -> str:
        return self.path if self.path is not None else materialize(store, self.folder)

    def load(self, store: ArtifactStore, resources: Resources):
        """(model, tokenizer) on the device and in the dtype of `resources`."""
        from race_core.policy import load_policy

        return load_policy(self.local_path(store), device=resources.device, dtype=resources.dtype)


def _put_policy(store: ArtifactStore, model, tokenizer) -> dict[str, Any]:
    """Save a trained policy into the store: the manifest fields `PolicyRef.from_manifest` reads."""
    from race_core.policy import save_policy

    with tempfile.TemporaryDirectory(prefix="race-policy-") as tmp:
        folder = save_policy(model, tokenizer, Path(tmp) / "policy")
        return {"objects": {"checkpoint": put_checkpoint(store, folder)}, "policy_digest": checkpoint_digest(folder)}


def _model_config(config: Any, resources: Resources, **extra: Any) -> dict[str, Any]:
    """A training stage's keyed config: its own settings and the dtype its model ran in."""
    return {**key_fields(config), "dtype": resources.dtype, **extra}


def sft(store: ArtifactStore, compressed_digest: str, base: PolicyRef, config: SFTConfig, resources: Resources,
        log: Log = _quiet, only_cached: bool = False, force: bool = False) -> dict[str, Any]:
    """Fine-tune the base policy on the compressed trajectories (assistant tokens only), in this
    process or in launched training processes (`tasks.training_runs`)."""
    keyed, inputs = {**_model_config(config, resources), **resources.training_keyed()}, {"compressed": compressed_digest}

    def compute() -> dict[str, Any]:
        from tasks.training_runs import sft_compute, train_state_dir

        return sft_compute(store, compressed_digest, base, config, resources,
                           train_state_dir("sft", keyed, inputs, base.digest), log)

    return run_stage(store, "sft", 1, keyed, inputs, base.digest, compute, only_cached, force, log)


def _rl_keyed(config: RLConfig, resources: Resources, iteration: int) -> dict[str, Any]:
    # one iteration does not depend on how many follow it
    return {k: v for k, v in _model_config(config, resources, iteration=iteration).items() if k != "iterations"}


def _sample_keyed(policy: PolicyRef, config: RLConfig, resources: Resources, iteration: int
                  ) -> tuple[dict[str, Any], dict[str, str]]:
    """The sample stage's keyed config and inputs."""
    keyed = {k: v for k, v in _rl_keyed(config, resources, iteration).items() if k != "cover_aware"}  # not sampling's
    return {**keyed, "env_revision": ENV_REVISION}, {"policy": policy.folder or policy.digest}


def sample_scope(policy: PolicyRef, config: RLConfig, resources: Resources, iteration: int) -> str:
    """The sample stage's key: the scope of its chunks' manifests (`tasks.chunks`)."""
    keyed, inputs = _sample_keyed(policy, config, resources, iteration)
    return stage_key("sample", 1, keyed, inputs, policy.digest, stage_code("sample", keyed))


def sample(store: ArtifactStore, policy: PolicyRef, config: RLConfig, resources: Resources, iteration: int,
           log: Log = _quiet, only_cached: bool = False, force: bool = False) -> dict[str, Any]:
    """On-policy episodes of the current policy in the calculator: K tasks × G rollouts, played in
    chunks of `config.sample_chunk` tasks (`tasks.chunks`), on the pool's workers when
    `resources.pool` names one."""
    keyed, inputs = _sample_keyed(policy, config, resources, iteration)

    def compute() -> dict[str, Any]:
        from race_core.rollout import rollouts_to_json, sample_chunks
        from tasks import chunks

        scope = sample_scope(policy, config, resources, iteration)
        planned = range(len(sample_chunks(config)))
        todo = [c for c in planned if force or chunks.chunk_committed(store, scope, c) is None]
        if len(planned) > 1 or resources.pool:
            log(f"sample: iteration {iteration}: {len(planned)} chunk(s) of up to {config.sample_chunk or config.tasks_per_iteration} "
                f"task(s); {len(planned) - len(todo)} committed before")
        if todo and resources.pool:  # child flow runs on the pool's workers (tasks.pool)
            from tasks.pool import sample_on_pool

            sample_on_pool(store, policy, config, resources, iteration, scope, todo, log, force=force)
        elif todo:
            chunks.sample_and_commit(store, scope, todo, lambda: policy.load(store, resources), config, iteration,
                                     log, device=resources.device, force=force)
        rollouts = chunks.merge_chunks(store, scope, len(planned))
        digest = store.put_bytes(rollouts_to_json(rollouts).encode("utf-8"))
        successes = sum(r.success for r in rollouts)
        turns = sum(len(r.turns) for r in rollouts)
        reasoning = sum(r.reasoning_token_count() for r in rollouts)
        log(f"sample: iteration {iteration}: {successes}/{len(rollouts)} rollouts succeeded")
        return {"objects": {"rollouts": digest},
                "metrics": {"rollouts": len(rollouts), "success_rate": successes / max(len(rollouts), 1),
                            "reasoning_tokens_per_turn": reasoning / max(turns, 1)}}

    return run_stage(store, "sample", 1, keyed, inputs, policy.digest, compute, only_cached, force, log)


def rl(store: ArtifactStore, policy: PolicyRef, rollouts_digest: str, config: RLConfig, epsilon: float,
       resources: Resources, iteration: int, log: Log = _quiet, only_cached: bool = False,
       force: bool = False) -> dict[str, Any]:
    """One cover-aware RL update of the policy on its own rollouts (cover at `epsilon`) -> a new policy,
    in this process or in launched training processes (`tasks.training_runs`)."""
    keyed = {**_rl_keyed(config, resources, iteration), "epsilon": epsilon, **resources.training_keyed()}
    inputs = {"policy": policy.folder or policy.digest, "rollouts": rollouts_digest}

    def compute() -> dict[str, Any]:
        from tasks.training_runs import rl_compute, train_state_dir

        return rl_compute(store, policy, rollouts_digest, config, epsilon, resources,
                          train_state_dir("rl", keyed, inputs, policy.digest), log)

    return run_stage(store, "rl", 1, keyed, inputs, policy.digest, compute, only_cached, force, log)


def evaluate(store: ArtifactStore, policy: PolicyRef, config: EvalConfig, resources: Resources, label: str = "",
             log: Log = _quiet, only_cached: bool = False, force: bool = False) -> dict[str, Any]:
    """Greedy success rate and reasoning tokens per episode on held-out tasks."""

    def compute() -> dict[str, Any]:
        from race_core.evaluate import evaluate_policy, heldout_tasks

        model, tokenizer = policy.load(store, resources)
        tasks = heldout_tasks(config.tasks, config.seed, shape=config.shape)
        report = evaluate_policy(model, tokenizer, tasks, greedy=True,
                                 seed=config.seed, max_turns=config.max_turns,
                                 max_new_tokens=config.max_new_tokens)
        summary = report.summary()
        log(f"evaluate{(' ' + label) if label else ''}: success {summary['success_rate']:.1%}, "
            f"reasoning tokens per episode {summary['reasoning_tokens_per_episode']:.1f}")
        digest = store.put_bytes(json.dumps(summary, sort_keys=True).encode())
        return {"objects": {"report": digest}, "metrics": summary}

    return run_stage(store, "evaluate", 1, _model_config(config, resources, greedy=True, env_revision=ENV_REVISION),
                     {}, policy.digest, compute, only_cached, force, log)
