"""Launching the training processes as a subprocess of the caller (the Prefect training task, on the
host that holds the devices), each running `python -m race_core.train.worker SPEC.json`:

- without an accelerate config: torchrun (`torch.distributed.run --standalone`), N processes on this
  host, DDP (gloo on the CPU, NCCL on GPUs: process k uses cuda:k);
- with one (`--accelerate-config FILE`): `accelerate launch --config_file FILE`, which brings FSDP,
  DeepSpeed ZeRO or several hosts (`num_machines`, `main_process_ip`, `main_process_port`: every
  other host runs `race train-node`, which launches its processes with its `--machine-rank`). On the
  CPU accelerate starts several processes only through MPI, so torchrun starts them with the
  config's hosts and process count (DDP over gloo).

Either launcher runs inside `python -m race_core.train.elastic`, which keeps what torch's elastic
agent knows of a failure as data. Rank 0's progress lines become `progress(step, total, loss)` calls;
its report (JSON) is returned. A process that fails ends the launch (torchrun stops the others) and
`TrainingFailed` names which rank failed how (from that record), and the step a rerun resumes from
(`race_core.train.distributed` saves the state).
"""

from __future__ import annotations

import collections
import json
import logging
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from race_core.train.distributed import LATEST, PROGRESS_PREFIX
from race_core.train.elastic import Failure, FailureRecord
from race_core.train.worker import LaunchSpec

Progress = Callable[[int, int, float], None]
TAIL_LINES = 40  # of the processes' output, quoted in a failure's message

logger = logging.getLogger(__name__)


class TrainingFailed(RuntimeError):
    """A launched training run ended with an error (its message says which rank, how, and where a
    rerun resumes)."""


def accelerate_settings(accelerate_config: str | Path) -> dict[str, Any]:
    """The accelerate config file's settings (YAML or JSON); a missing or unreadable file is an error
    naming it."""
    import yaml

    path = Path(accelerate_config)
    if not path.is_file():
        raise FileNotFoundError(f"parameter 'resources.accelerate_config': {str(path)!r} is not a file")
    settings = yaml.safe_load(path.read_text()) or {}
    if not isinstance(settings, dict):
        raise ValueError(f"parameter 'resources.accelerate_config': {str(path)!r} is not an accelerate config")
    return settings


def machines(accelerate_config: str) -> int:
    """The hosts a launch spans: the accelerate config's `num_machines` (1 without a config)."""
    return int(accelerate_settings(accelerate_config).get("num_machines", 1) or 1) if accelerate_config else 1


def launch_command(spec_path: str | Path, processes: int, device: str, accelerate_config: str = "",
                   mixed_precision: str = "no", machine_rank: int | None = None) -> list[str]:
    """The command line that starts the training processes of `spec_path` on this host (`machine_rank`:
    which host this is, when the accelerate config spans several; default its `machine_rank`). The
    launcher runs in `race_core.train.elastic`, which writes a failure's record to `record_path(spec_path)`."""
    target = ["-m", "race_core.train.worker", str(spec_path)]
    elastic = [sys.executable, "-m", "race_core.train.elastic", str(record_path(spec_path))]
    if accelerate_config and device != "cpu":
        command = [*elastic, "accelerate", "--config_file", str(accelerate_config),
                   "--mixed_precision", mixed_precision]
        accelerate_settings(accelerate_config)  # exists and parses
        if processes:
            command += ["--num_processes", str(processes)]
        if machine_rank is not None:
            command += ["--machine_rank", str(machine_rank)]
        return command + target
    if not accelerate_config:
        return [*elastic, "torchrun", "--standalone", "--nproc_per_node",
                str(max(processes, 1)), *target]
    # CPU processes: accelerate starts several only through MPI, so torchrun starts them with the config's
    # hosts (DDP over gloo; FSDP and DeepSpeed need GPUs).
    settings = accelerate_settings(accelerate_config)
    kind = str(settings.get("distributed_type", "MULTI_CPU")).upper()
    if kind not in ("NO", "MULTI_CPU", "MULTI_GPU"):
        raise ValueError(f"parameter 'resources.accelerate_config': {kind} needs GPUs (resources.device is cpu)")
    hosts = int(settings.get("num_machines", 1) or 1)
    total = processes or int(settings.get("num_processes", 1) or 1)
    if total % hosts:
        raise ValueError(f"{total} training processes do not divide evenly over {hosts} hosts")
    rank = machine_rank if machine_rank is not None else int(settings.get("machine_rank", 0) or 0)
    command = [*elastic, "torchrun", "--nproc_per_node", str(total // hosts)]
    if hosts == 1:
        return [*command, "--standalone", *target]
    return [*command, "--nnodes", str(hosts), "--node_rank", str(rank),
            "--master_addr", str(settings.get("main_process_ip") or "127.0.0.1"),
            "--master_port", str(settings.get("main_process_port") or 29500), *target]


def _environment(device: str, processes: int) -> dict[str, str]:
    env = dict(os.environ)
    if device.startswith("cuda:"):
        if processes > 1:
            raise ValueError(f"parameter 'resources.device': {device!r} names one GPU for {processes} training "
                             "processes: use cuda (process k takes the k-th visible GPU; CUDA_VISIBLE_DEVICES "
                             "chooses which)")
        env["CUDA_VISIBLE_DEVICES"] = device.split(":", 1)[1]
    if device == "cpu":  # torchrun would set 1 thread per process
        env.setdefault("OMP_NUM_THREADS", str(max(1, (os.cpu_count() or 1) // max(processes, 1))))
    env["PYTHONUNBUFFERED"] = "1"
    return env


def launch(spec: LaunchSpec, spec_path: str | Path, processes: int, accelerate_config: str = "",
           progress: Progress | None = None, machine_rank: int | None = None
           ) -> dict[str, Any] | None:
    """Run the training of `spec` (written to `spec_path`) in launched processes on this host; the
    report of rank 0 (None on a host without rank 0)."""
    spec.write(spec_path)
    mixed_precision = spec.options.get("mixed_precision", "no")
    command = launch_command(spec_path, processes, spec.device, accelerate_config, mixed_precision, machine_rank)
    logger.info(f"{spec.kind}: launching {processes or 'the configured'} training process(es): "
                f"{' '.join(command[4:7])}")
    tail: collections.deque[str] = collections.deque(maxlen=TAIL_LINES)
    record = record_path(spec_path)
    record.unlink(missing_ok=True)  # a record left by an earlier launch of this spec
    with subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                          env=_environment(spec.device, processes)) as proc:
        assert proc.stdout is not None
        for line in proc.stdout:
            line = line.rstrip("\n")
            if line.startswith(PROGRESS_PREFIX):
                if progress is not None:
                    step = json.loads(line[len(PROGRESS_PREFIX):])
                    progress(step["step"], step["total"], step["loss"])
                continue
            tail.append(line)
            if line.startswith("resuming from step"):
                logger.info(f"{spec.kind}: {line}")
    if proc.returncode != 0:
        raise TrainingFailed(failure_message(spec, proc.returncode, list(tail), FailureRecord.read(record)))
    report = Path(spec.report)
    return json.loads(report.read_text()) if report.exists() else None


def record_path(spec_path: str | Path) -> Path:
    """Where the launcher writes the record of a failed launch of `spec_path` (`race_core.train.elastic`)."""
    return Path(spec_path).with_suffix(".failures.json")


def failure_message(spec: LaunchSpec, returncode: int, tail: list[str], record: FailureRecord | None = None) -> str:
    """Which rank failed how (from the launcher's `record`; none named without one), where a rerun
    resumes, and the output's end."""
    record = record or FailureRecord()
    culprit, others = record.culprit()
    stopped = set(record.stopped)
    who = ""
    if culprit is not None:
        who = f": rank {culprit.rank} {_how(culprit)}"
        if others:
            who += " (and " + ", ".join(
                f"rank {failure.rank} " + ("was stopped by torchrun" if failure.pid in stopped else _how(failure))
                for failure in others) + ")"
    text = "\n".join(tail)
    state = spec.options.get("state_dir")
    latest = Path(state) / LATEST if state else None
    if latest is not None and latest.exists():
        step = json.loads(latest.read_text())["step"]
        resume = f"the last saved training state is step {step} ({state}); a rerun resumes from it"
    elif state and spec.options.get("save_every"):
        resume = f"no training state was saved yet (one every {spec.options['save_every']} steps); a rerun starts over"
    else:
        resume = "no training state is saved (train_save_every is 0); a rerun starts over"
    return (f"{spec.kind}: the training processes failed (exit code {returncode}){who}; {resume}.\n"
            f"last output:\n{text}")


def _how(failure: Failure) -> str:
    code = failure.exitcode
    if code >= 0:
        return f"exited with code {code}"
    import signal

    try:
        return f"was killed by signal {-code} ({signal.Signals(-code).name})"
    except ValueError:
        return f"was killed by signal {-code}"
