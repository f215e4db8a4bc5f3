"""What a launched training process runs (`python -m race_core.train.worker SPEC.json`, started by
`race_core.train.launch`): it reads its `LaunchSpec`, loads the checkpoint, trains with the SFT loop
or the RL update (both under `race_core.train.distributed`'s `TrainRun`), and rank 0 writes the
checkpoint and a JSON report. Errors are recorded through torch's elastic `record`, so torchrun's
summary carries the failing rank's traceback.
"""

from __future__ import annotations

import json
import logging
import os
import sys
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from race_core.config import DEFAULT_EPSILON
from race_core.train.distributed import PROGRESS_PREFIX, TrainOptions


@dataclass
class LaunchSpec:
    """What a launched training process does (JSON on disk, written by `race_core.train.launch`).

    `kind` is sft or rl; `checkpoint` the local folder of the policy to train; `data` a local file of
    trajectories (JSONL, sft) or the rollouts' JSON (rl); `config` the stage config (its `asdict`);
    `out_dir` where rank 0 saves the trained checkpoint, `report` its JSON report."""

    kind: str
    checkpoint: str
    data: str
    config: dict[str, Any]
    out_dir: str
    report: str
    device: str = "cpu"
    dtype: str = "float32"
    options: dict[str, Any] = field(default_factory=dict)  # TrainOptions fields
    epsilon: float = DEFAULT_EPSILON  # rl: the cover's tolerance
    optimizer: str = ""  # rl: a folder of the optimizer state to continue from ("": a fresh optimizer)
    iteration: int = 0  # rl: which iteration of the run (its seed)

    def write(self, path: str | Path) -> Path:
        Path(path).write_text(json.dumps(asdict(self), indent=1))
        return Path(path)

    @classmethod
    def read(cls, path: str | Path) -> LaunchSpec:
        return cls(**json.loads(Path(path).read_text()))


def optimizer_folder(spec: LaunchSpec) -> Path:
    """Where rank 0 of an rl launch saves the optimizer's state after the update: beside the checkpoint."""
    return Path(spec.out_dir).with_name("optimizer")


def _progress_line(step: int, total: int, loss: float) -> None:
    print(PROGRESS_PREFIX + json.dumps({"step": step, "total": total, "loss": loss}), flush=True)


def run_spec(spec: LaunchSpec) -> dict[str, Any] | None:
    """Train as `spec` says in this (launched) process; rank 0 saves the checkpoint and returns the
    report (other ranks return None)."""
    from race_core.config import RLConfig, SFTConfig, from_dict
    from race_core.policy import load_policy

    options = TrainOptions(**spec.options)
    device = "cpu" if spec.device == "cpu" else f"cuda:{int(os.environ.get('LOCAL_RANK', '0'))}"
    model, tokenizer = load_policy(spec.checkpoint, device=device, dtype=spec.dtype)
    if spec.kind == "sft":
        from race_core.schema import Trajectory
        from race_core.train.sft import train_sft

        with open(spec.data, encoding="utf-8") as fh:
            trajectories = [Trajectory.from_dict(json.loads(line)) for line in fh if line.strip()]
        report = train_sft(model, tokenizer, trajectories, from_dict(SFTConfig, spec.config), spec.out_dir,
                           progress=_progress_line, options=options, base_checkpoint=spec.checkpoint)
        summary = {"steps": report.steps, "losses": report.losses, "grad_norms": report.grad_norms,
                   "target_tokens": report.target_tokens, "trajectories": len(trajectories), **report.extra}
    elif spec.kind == "rl":
        from race_core.rollout import rollouts_from_json
        from race_core.train.optimizer_state import load_optimizer, save_optimizer
        from race_core.train.rl import make_optimizer, update_from_rollouts

        config = from_dict(RLConfig, spec.config)
        rollouts = rollouts_from_json(Path(spec.data).read_text(encoding="utf-8"))
        optimizer = make_optimizer(model, config)
        if spec.optimizer:
            load_optimizer(optimizer, model, spec.optimizer)
        report = update_from_rollouts(model, tokenizer, rollouts, config, optimizer=optimizer,
                                      epsilon=spec.epsilon, options=options, out_dir=spec.out_dir,
                                      base_checkpoint=spec.checkpoint, iteration=spec.iteration)
        summary = {**report.summary(), **report.extra}
        if summary.get("rank", 0) == 0:  # replicated under DDP: rank 0's is every process's
            if report.extra.get("distributed_type") in ("FSDP", "DEEPSPEED"):
                raise ValueError(f"an RL run carries its optimizer between iterations in one process or under DDP, "
                                 f"not {report.extra['distributed_type']} (its state is sharded)")
            save_optimizer(optimizer, model, optimizer_folder(spec))
    else:
        raise ValueError(f"unknown training kind {spec.kind!r}: expected sft or rl")
    if summary.get("rank", 0) != 0:
        return None
    Path(spec.report).write_text(json.dumps(summary))
    return summary


def main(argv: list[str] | None = None) -> int:
    from torch.distributed.elastic.multiprocessing.errors import record

    return record(_main)(argv)


def _main(argv: list[str] | None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 1:
        print("usage: python -m race_core.train.worker SPEC.json", file=sys.stderr)
        return 2
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    run_spec(LaunchSpec.read(args[0]))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
