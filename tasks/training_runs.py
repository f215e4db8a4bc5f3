"""The compute bodies of the training stages (sft, rl): in this process, or in launched training
processes on this host (`race_core.train.launch`: torchrun, or `accelerate launch` with an accelerate
config) when `resources.train_processes` > 1 or `resources.accelerate_config` is set.

Either way the stage's output is one checkpoint (rank 0's) put into the store, and the manifest's
metrics carry the process count and the loss of every optimizer step. The training state is saved
every `resources.train_save_every` steps under `train_state_dir(...)`, a local folder named by the
stage's key, so a rerun of a stage that died resumes at its last saved step; it is removed once the
checkpoint is stored.
"""

from __future__ import annotations

import json
import tempfile
from collections.abc import Callable
from dataclasses import asdict
from pathlib import Path
from typing import Any

from race_core.config import Resources, RLConfig, SFTConfig
from race_core.policy import checkpoint_digest
from race_core.train.distributed import LaunchSpec, TrainOptions, clear_state
from storage import ArtifactStore, put_checkpoint, stage_key
from tasks.fingerprints import stage_code

Log = Callable[[str], None]


def launches(resources: Resources) -> bool:
    """Whether the training stages run in launched processes (else in this one)."""
    return resources.train_processes > 1 or bool(resources.accelerate_config)


def train_state_dir(stage: str, keyed: dict[str, Any], inputs: dict[str, str], model_digest: str) -> Path:
    """The local folder of a training stage's saved state: beside the checkpoint cache, by stage key."""
    from tasks.training_stages import checkpoint_cache

    key = stage_key(stage, 1, keyed, inputs, model_digest, stage_code(stage, keyed))
    return checkpoint_cache().parent / "train-state" / f"{stage}-{key}"


def put_policy_folder(store: ArtifactStore, folder: str | Path) -> dict[str, Any]:
    """A saved policy folder into the store: the manifest fields `PolicyRef.of` reads."""
    return {"objects": {"checkpoint": put_checkpoint(store, folder)}, "policy_digest": checkpoint_digest(folder)}


def training_metrics(report_facts: dict[str, Any], losses: list[float], grad_norms: list[float]) -> dict[str, Any]:
    """What every training stage's metrics record of how it trained."""
    return {"step_losses": [float(x) for x in losses], "grad_norms": [float(x) for x in grad_norms],
            "processes": int(report_facts.get("processes", 1)),
            **{k: report_facts[k] for k in ("distributed_type", "mixed_precision", "gradient_checkpointing",
                                            "resumed_from_step") if k in report_facts}}


def _launched(store: ArtifactStore, kind: str, checkpoint: str, write_data: Callable[[Path], None],
              config: Any, resources: Resources, state: Path, progress, log: Log, epsilon: float = 0.0
              ) -> tuple[dict[str, Any], dict[str, Any]]:
    """Train in launched processes: (rank 0's report, the stored policy's manifest fields)."""
    from race_core.train.launch import launch

    state.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix=f"race-{kind}-") as tmp:
        data = Path(tmp) / "data"
        write_data(data)
        spec = LaunchSpec(kind=kind, checkpoint=checkpoint, data=str(data), config=asdict(config),
                          out_dir=str(Path(tmp) / "policy"), report=str(Path(tmp) / "report.json"),
                          device=resources.device, dtype=resources.dtype,
                          options=asdict(TrainOptions.of(resources, state)), epsilon=epsilon)
        report = launch(spec, Path(tmp) / "spec.json", resources.train_processes, resources.accelerate_config,
                        progress=progress, log=log)
        if report is None:
            raise RuntimeError(f"{kind}: the training processes ended without rank 0's report")
        return report, put_policy_folder(store, spec.out_dir)


def sft_compute(store: ArtifactStore, trajectories: list, base, config: SFTConfig, resources: Resources,
                state: Path, log: Log) -> dict[str, Any]:
    """Fine-tune `base` (a `PolicyRef`) on `trajectories`; the sft manifest's objects and metrics."""
    from race_core.train import sft as sft_module

    every = max(1, (config.steps or 100) // 10)

    def progress(step: int, total: int, loss: float) -> None:
        if step == 1 or step % every == 0 or step == total:
            log(f"sft: step {step}/{total} loss {loss:.4f}")

    if launches(resources):
        def write(path: Path) -> None:
            with open(path, "w", encoding="utf-8") as fh:
                for trajectory in trajectories:
                    fh.write(json.dumps(trajectory.to_dict(), ensure_ascii=False) + "\n")

        report, stored = _launched(store, "sft", base.local_path(store), write, config, resources, state,
                                   progress, log)
        losses, steps, target_tokens = report["losses"], report["steps"], report["target_tokens"]
        grad_norms = report["grad_norms"]
    else:
        model, tokenizer = base.load(store, resources)
        result = sft_module.train_sft(model, tokenizer, trajectories, config, progress=progress,
                                      options=TrainOptions.of(resources, state))
        if result.extra.get("resumed_from_step"):
            log(f"sft: resumed from step {result.extra['resumed_from_step']}")
        from tasks.training_stages import _put_policy

        stored = _put_policy(store, result.model, tokenizer)
        report, losses, steps, target_tokens = result.extra, result.losses, result.steps, result.target_tokens
        grad_norms = result.grad_norms
    clear_state(state)
    return {**stored, "metrics": {"trajectories": len(trajectories), "steps": steps,
                                  "first_loss": losses[0] if losses else float("nan"),
                                  "last_loss": losses[-1] if losses else float("nan"),
                                  "target_tokens": target_tokens, **training_metrics(report, losses, grad_norms)}}


def rl_compute(store: ArtifactStore, policy, rollouts_digest: str, config: RLConfig, epsilon: float,
               resources: Resources, state: Path, log: Log) -> dict[str, Any]:
    """One cover-aware RL update of `policy` (a `PolicyRef`) on the stored rollouts; the rl manifest's
    objects and metrics."""
    if launches(resources):
        def write(path: Path) -> None:
            path.write_bytes(store.get_bytes(rollouts_digest))

        summary, stored = _launched(store, "rl", policy.local_path(store), write, config, resources, state,
                                    None, log, epsilon=epsilon)
    else:
        from race_core.rollout import rollouts_from_json
        from race_core.train.rl import update_from_rollouts

        model, tokenizer = policy.load(store, resources)
        rollouts = rollouts_from_json(store.get_bytes(rollouts_digest).decode("utf-8"))
        report = update_from_rollouts(model, tokenizer, rollouts, config, epsilon=epsilon,
                                      options=TrainOptions.of(resources, state))
        from tasks.training_stages import _put_policy

        stored = _put_policy(store, model, tokenizer)
        summary = {**report.summary(), **report.extra}
    log(f"rl: loss {summary['loss']:.5f}, masked tokens {summary['masked_tokens']}, closure terms "
        f"{summary['closure_terms']}, policy tokens {summary['policy_tokens']}")
    clear_state(state)
    metrics = {k: v for k, v in summary.items() if k not in ("rank", "step_losses", "grad_norms")}
    return {**stored, "metrics": {**metrics, **training_metrics(summary, summary["step_losses"],
                                                                summary["grad_norms"])}}
