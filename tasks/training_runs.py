"""The compute bodies of the training stages (sft, rl): in this process, or in launched training
processes on this host (`race_core.train.launch`: torchrun, or `accelerate launch` with an accelerate
config) when `resources.train_processes` > 1 or `resources.accelerate_config` is set.

Either way the stage's output is one checkpoint (rank 0's) put into the store, and the manifest's
metrics carry the process count and the loss of every optimizer step. The training state is saved
every `resources.train_save_every` steps under `train_state_dir(...)`, a local folder named by the
stage's key, so a rerun of a stage that died resumes at its last saved step; it is removed once the
checkpoint is stored. A run whose accelerate config spans several hosts is this host's share
(machine rank 0, which writes the checkpoint): the job goes into the store, and every other host
joins with `race train-node --job DIGEST` (`run_job`).
"""

from __future__ import annotations

import json
import logging
import tempfile
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from race_core.config import DEFAULT_EPSILON, Resources, RLConfig, SFTConfig
from race_core.policy import checkpoint_digest
from race_core.train.distributed import TrainOptions, clear_state
from race_core.train.worker import LaunchSpec
from storage import ArtifactStore, put_checkpoint, stage_key
from tasks.base import iter_trajectories
from tasks.declarations import declared
from tasks.fingerprints import stage_code

logger = logging.getLogger(__name__)


def make_room(resources: Resources) -> None:
    """Before training on a GPU: the process's shared sampling engine gives its memory back (it is built
    again, once, by the next stage that samples). On a CPU it stays: its memory is the host's."""
    if resources.device.split(":")[0] == "cuda":
        from race_core.sampling.shared import release_shared

        release_shared()


def launches(resources: Resources) -> bool:
    """Whether the training stages run in launched processes (else in this one)."""
    return resources.train_processes > 1 or bool(resources.accelerate_config)


def train_state_root() -> Path:
    """Where the training stages' saved states live: beside the checkpoint cache."""
    from tasks.policy_ref import checkpoint_cache

    return checkpoint_cache().parent / "train-state"


def train_state_dir(stage: str, keyed: dict[str, Any], inputs: dict[str, str], model_digest: str) -> Path:
    """The local folder of a training stage's saved state, named by the stage's key."""
    key = stage_key(stage, declared(stage).version, keyed, inputs, model_digest, stage_code(stage, keyed))
    return train_state_root() / f"{stage}-{key}"


def put_policy_folder(store: ArtifactStore, folder: str | Path) -> dict[str, Any]:
    """A saved policy folder into the store: the manifest fields `PolicyRef.of` reads."""
    return {"objects": {"checkpoint": put_checkpoint(store, folder)}, "policy_digest": checkpoint_digest(folder)}


def training_metrics(report_facts: dict[str, Any], losses: list[float], grad_norms: list[float]) -> dict[str, Any]:
    """What every training stage's metrics record of how it trained."""
    return {"step_losses": [float(x) for x in losses], "grad_norms": [float(x) for x in grad_norms],
            "processes": int(report_facts.get("processes", 1)),
            **{k: report_facts[k] for k in ("distributed_type", "mixed_precision", "gradient_checkpointing",
                                            "resumed_from_step") if k in report_facts}}


@dataclass(frozen=True)
class TrainJob:
    """A training stage's launched run as every host needs it: the policy (`PolicyRef` fields), the
    data object (the compressed trajectories for sft, the rollouts' JSON for rl), the stage config,
    the resources, and the name of its state folder. Stored as JSON for the other hosts of a
    several-host run (`race train-node --job DIGEST`)."""

    kind: str
    policy: dict[str, Any]
    data: str
    config: dict[str, Any]
    resources: dict[str, Any]
    state: str
    epsilon: float = DEFAULT_EPSILON  # rl: the cover's tolerance (the run's cover.epsilon); sft reads none
    optimizer: str = ""  # rl: the optimizer state's object to continue from ("": a fresh optimizer)
    iteration: int = 0  # rl: the iteration of the run

    @classmethod
    def read(cls, store: ArtifactStore, digest: str) -> TrainJob:
        return cls(**json.loads(store.get_bytes(digest).decode("utf-8")))

    def put(self, store: ArtifactStore) -> str:
        return store.put_bytes(json.dumps(asdict(self), sort_keys=True).encode("utf-8"))


def _checkpoint_here(store: ArtifactStore, job: TrainJob, verify: bool) -> str:
    """The job's policy as a local folder on this host (`verify`: a local path must hold that very policy)."""
    from tasks.policy_ref import PolicyRef

    policy = PolicyRef(**job.policy)
    if policy.path is None:
        return policy.local_path(store)
    if verify and (not Path(policy.path).is_dir() or checkpoint_digest(policy.path) != policy.digest):
        raise FileNotFoundError(f"{job.kind}: the policy is the local folder {policy.path!r} of the launching host, "
                                "and this host holds no copy of it there: give every host that folder at that path")
    return policy.path


def _write_data(store: ArtifactStore, job: TrainJob, path: Path) -> None:
    if job.kind == "rl":
        path.write_bytes(store.get_bytes(job.data))
        return
    with open(path, "w", encoding="utf-8") as fh:
        for trajectory in iter_trajectories(store, job.data, "compressed"):
            fh.write(json.dumps(trajectory.to_dict(), ensure_ascii=False) + "\n")


def run_job(store: ArtifactStore, job: TrainJob, machine_rank: int | None = None, accelerate_config: str = "",
            progress=None) -> tuple[dict[str, Any], dict[str, Any]] | None:
    """Run `job`'s training processes on this host. On the host of rank 0: (its report, the stored
    policy's manifest fields); elsewhere None. The state folder is removed once the run succeeded."""
    from race_core.config import from_dict
    from race_core.train.launch import launch

    resources = from_dict(Resources, job.resources)
    config_file = accelerate_config or resources.accelerate_config
    state = train_state_root() / job.state
    state.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix=f"race-{job.kind}-") as tmp:
        data = Path(tmp) / "data"
        _write_data(store, job, data)
        optimizer = str(store.restore_folder(job.optimizer, Path(tmp) / "optimizer-in")) if job.optimizer else ""
        spec = LaunchSpec(kind=job.kind, checkpoint=_checkpoint_here(store, job, verify=bool(machine_rank)),
                          data=str(data), config=job.config, out_dir=str(Path(tmp) / "policy"),
                          report=str(Path(tmp) / "report.json"), device=resources.device, dtype=resources.dtype,
                          options=asdict(TrainOptions.of(resources, state)), epsilon=job.epsilon,
                          optimizer=optimizer, iteration=job.iteration)
        report = launch(spec, Path(tmp) / "spec.json", resources.train_processes, config_file,
                        progress=progress, machine_rank=machine_rank)
        stored = put_policy_folder(store, spec.out_dir) if report is not None else None
        if stored is not None and job.kind == "rl":  # the optimizer state it ends with, for the next iteration
            from race_core.train.worker import optimizer_folder

            stored["optimizer"] = store.put_folder(optimizer_folder(spec))
    clear_state(state)
    return (report, stored) if report is not None else None


def _launched(store: ArtifactStore, job: TrainJob, resources: Resources, progress
              ) -> tuple[dict[str, Any], dict[str, Any]]:
    """Train in launched processes from this host (rank 0's): (its report, the stored policy's fields).
    When the accelerate config spans several hosts, the job goes into the store and the log says what
    each other host runs to join."""
    from race_core.train.launch import machines

    hosts = machines(resources.accelerate_config)
    if hosts > 1:
        digest = job.put(store)
        for rank in range(1, hosts):
            logger.info(f"{job.kind}: on host {rank} run: race train-node --store {store.url} --job {digest} "
                        f"--machine-rank {rank} --accelerate-config {resources.accelerate_config}")
    done = run_job(store, job, machine_rank=0 if hosts > 1 else None, progress=progress)
    if done is None:
        raise RuntimeError(f"{job.kind}: the training processes ended without rank 0's report (is this host "
                           "machine_rank 0 of the accelerate config?)")
    return done


def sft_compute(store: ArtifactStore, data: str, base, config: SFTConfig, resources: Resources, state: Path
                ) -> dict[str, Any]:
    """Fine-tune `base` (a `PolicyRef`) on the compressed trajectories of object `data`; the sft
    manifest's objects and metrics."""
    from race_core.train import sft as sft_module

    every = max(1, (config.steps or 100) // 10)
    make_room(resources)

    def progress(step: int, total: int, loss: float) -> None:
        if step == 1 or step % every == 0 or step == total:
            logger.info(f"sft: step {step}/{total} loss {loss:.4f}")

    if launches(resources):
        job = TrainJob("sft", asdict(base), data, asdict(config), asdict(resources), state.name)
        report, stored = _launched(store, job, resources, progress)
        losses, steps, target_tokens = report["losses"], report["steps"], report["target_tokens"]
        grad_norms, count = report["grad_norms"], report["trajectories"]
    else:
        trajectories = list(iter_trajectories(store, data, "compressed"))
        count = len(trajectories)
        model, tokenizer = base.load(store, resources)
        result = sft_module.train_sft(model, tokenizer, trajectories, config, progress=progress,
                                      options=TrainOptions.of(resources, state))
        if result.extra.get("resumed_from_step"):
            logger.info(f"sft: resumed from step {result.extra['resumed_from_step']}")
        from tasks.policy_ref import put_policy

        stored = put_policy(store, result.model, tokenizer)
        report, losses, steps, target_tokens = result.extra, result.losses, result.steps, result.target_tokens
        grad_norms = result.grad_norms
    clear_state(state)
    return {**stored, "metrics": {"trajectories": count, "steps": steps,
                                  "first_loss": losses[0] if losses else float("nan"),
                                  "last_loss": losses[-1] if losses else float("nan"),
                                  "target_tokens": target_tokens, **training_metrics(report, losses, grad_norms)}}


def rl_compute(store: ArtifactStore, policy, rollouts_digest: str, config: RLConfig, epsilon: float,
               resources: Resources, state: Path, optimizer: str = "", iteration: int = 0) -> dict[str, Any]:
    """One cover-aware RL update of `policy` (a `PolicyRef`) on the stored rollouts, its optimizer
    continuing from the state object `optimizer` ("": a fresh one); the policy's manifest fields, the
    update's metrics, and in launched processes `optimizer`, the state object it ends with."""
    if launches(resources):
        job = TrainJob("rl", asdict(policy), rollouts_digest, asdict(config), asdict(resources), state.name, epsilon,
                       optimizer=optimizer, iteration=iteration)
        summary, stored = _launched(store, job, resources, None)
    else:
        from race_core.rollout import rollouts_from_json
        from race_core.train.rl import update_from_rollouts

        model, tokenizer = policy.load(store, resources)
        rollouts = rollouts_from_json(store.get_bytes(rollouts_digest).decode("utf-8"))
        report = update_from_rollouts(model, tokenizer, rollouts, config, epsilon=epsilon,
                                      options=TrainOptions.of(resources, state), iteration=iteration)
        from tasks.policy_ref import put_policy

        stored = put_policy(store, model, tokenizer)
        summary = {**report.summary(), **report.extra}
    logger.info(f"rl: loss {summary['loss']:.5f}, masked tokens {summary['masked_tokens']}, closure terms "
                f"{summary['closure_terms']}, policy tokens {summary['policy_tokens']}")
    clear_state(state)
    metrics = {k: v for k, v in summary.items() if k not in ("rank", "step_losses", "grad_norms")}
    return {**stored, "metrics": {**metrics, **training_metrics(summary, summary["step_losses"],
                                                                summary["grad_norms"])}}
