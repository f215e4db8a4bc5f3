"""Training stages as plain functions (manifests in, manifests out): SFT on the compressed
trajectories, on-policy sampling in the calculator, the cover-aware RL update, and evaluation.

Checkpoints live in the store as folder objects; `materialize` restores one to a local cache
folder (by digest, verified) so transformers can load it with `from_pretrained`.
"""

from __future__ import annotations

import json
import os
import tempfile
from dataclasses import asdict
from pathlib import Path
from typing import Any

from race_core.tiny import checkpoint_digest
from storage import ArtifactStore, put_checkpoint, restore_checkpoint
from tasks.stages import Log, _quiet, iter_trajectories, run_stage

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


def _put_policy(store: ArtifactStore, folder: Path) -> tuple[str, str]:
    """(folder object digest, model digest) of a saved checkpoint."""
    return put_checkpoint(store, folder), checkpoint_digest(folder)


def sft(store: ArtifactStore, compressed_digest: str, base_checkpoint: str, base_digest: str, config,
        log: Log = _quiet) -> dict[str, Any]:
    """Fine-tune the base policy on the compressed trajectories (assistant tokens only)."""

    def compute() -> dict[str, Any]:
        from race_core.train.sft import train_sft

        trajectories = list(iter_trajectories(store, compressed_digest, "compressed"))
        every = max(1, (config.steps or 100) // 10)

        def progress(step: int, total: int, loss: float) -> None:
            if step == 1 or step % every == 0 or step == total:
                log(f"sft: step {step}/{total} loss {loss:.4f}")

        with tempfile.TemporaryDirectory(prefix="race-sft-") as tmp:
            report = train_sft(base_checkpoint, None, trajectories, config, Path(tmp) / "policy", progress)
            folder_digest, model_digest = _put_policy(store, Path(tmp) / "policy")
        return {"objects": {"checkpoint": folder_digest}, "policy_digest": model_digest,
                "metrics": {"trajectories": len(trajectories), "steps": report.steps,
                            "first_loss": report.first_loss, "last_loss": report.last_loss,
                            "target_tokens": report.target_tokens}}

    return run_stage(store, "sft", 1, asdict(config), {"compressed": compressed_digest}, base_digest, compute)


def sample(store: ArtifactStore, policy_folder: str, policy_digest: str, config, iteration: int,
           log: Log = _quiet) -> dict[str, Any]:
    """On-policy episodes of the current policy in the calculator: K tasks × G rollouts."""

    def compute() -> dict[str, Any]:
        from race_core.train.onpolicy import rollouts_to_json, sample_rollouts

        checkpoint = materialize(store, policy_folder)
        rollouts = sample_rollouts(checkpoint, config, iteration)
        digest = store.put_bytes(rollouts_to_json(rollouts).encode("utf-8"))
        successes = sum(r.success for r in rollouts)
        turns = sum(len(r.turns) for r in rollouts)
        reasoning = sum(r.reasoning_token_count() for r in rollouts)
        log(f"sample: iteration {iteration}: {successes}/{len(rollouts)} rollouts succeeded")
        return {"objects": {"rollouts": digest},
                "metrics": {"rollouts": len(rollouts), "success_rate": successes / max(len(rollouts), 1),
                            "reasoning_tokens_per_turn": reasoning / max(turns, 1)}}

    return run_stage(store, "sample", 1, {**asdict(config), "iteration": iteration}, {"policy": policy_folder},
                     policy_digest, compute)


def rl(store: ArtifactStore, policy_folder: str, policy_digest: str, rollouts_digest: str, config,
       log: Log = _quiet) -> dict[str, Any]:
    """One cover-aware RL update of the policy on its own rollouts -> a new checkpoint."""

    def compute() -> dict[str, Any]:
        from race_core.policy import load_policy, save_policy
        from race_core.train.onpolicy import rl_update, rollouts_from_json

        model, tokenizer = load_policy(materialize(store, policy_folder))
        rollouts = rollouts_from_json(store.get_bytes(rollouts_digest).decode("utf-8"))
        report = rl_update(model, tokenizer, rollouts, config)
        log(f"rl: loss {report.loss:.5f}, masked tokens {report.masked_tokens}, closure terms "
            f"{report.closure_terms}, policy tokens {report.policy_tokens}")
        with tempfile.TemporaryDirectory(prefix="race-rl-") as tmp:
            save_policy(model, tokenizer, Path(tmp) / "policy")
            folder_digest, model_digest = _put_policy(store, Path(tmp) / "policy")
        return {"objects": {"checkpoint": folder_digest}, "policy_digest": model_digest,
                "metrics": report.summary()}

    return run_stage(store, "rl", 1, asdict(config), {"policy": policy_folder, "rollouts": rollouts_digest},
                     policy_digest, compute)


def evaluate(store: ArtifactStore, checkpoint: str, policy_digest: str, tasks: int, seed: int,
             log: Log = _quiet, label: str = "") -> dict[str, Any]:
    """Greedy success rate and reasoning tokens per episode on held-out tasks."""

    def compute() -> dict[str, Any]:
        from race_core.evaluate import evaluate_policy, heldout_tasks
        from race_core.policy import load_policy

        model, tokenizer = load_policy(checkpoint)
        report = evaluate_policy(model, tokenizer, heldout_tasks(tasks, seed), greedy=True, seed=seed)
        summary = report.summary()
        log(f"evaluate{(' ' + label) if label else ''}: success {summary['success_rate']:.1%}, "
            f"reasoning tokens per episode {summary['reasoning_tokens_per_episode']:.1f}")
        digest = store.put_bytes(json.dumps(summary, sort_keys=True).encode())
        return {"objects": {"report": digest}, "metrics": summary}

    return run_stage(store, "evaluate", 1, {"tasks": tasks, "seed": seed, "greedy": True}, {}, policy_digest,
                     compute)
