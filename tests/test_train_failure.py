"""Which rank a failed training run names, from what torch's elastic agent knows of the failure
(`race_core.train.elastic`: its failures and the processes it stopped, kept as data), made here by
torch's real process context (the one torchrun runs) and by real torchrun, on two real processes.

The race CI hit once: rank 1 was SIGKILLed; rank 0, whose collective broke when its peer died, wrote
its error file in the second before torchrun noticed the death; torchrun then stopped rank 0 with
SIGTERM and, ordering failures by their whole-second timestamps, called rank 0 the root cause. Here
the two processes play that order on purpose (rank 0 writes its error through torch's ErrorHandler,
rank 1 kills itself a second later), so the case no longer depends on the scheduler's timing. The
survivor's traceback is long, as a real one is, so torchrun's summary runs past the tail of output a
failure's message quotes: the tail could not say who failed."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

from race_core.train.elastic import FailureRecord, stopped_processes
from race_core.train.launch import TAIL_LINES, failure_message
from race_core.train.worker import LaunchSpec

SURVIVOR = r"""
import pathlib, sys, time
from torch.distributed.elastic.multiprocessing.errors import ErrorHandler
# frames f0 .. f39 calling each other: deep, as a real one is, its traceback longer than the tail kept
exec("".join(f"def f{i}():\n    f{i + 1}()\n" for i in range(40)))
exec("def f40():\n    raise RuntimeError('Connection closed by peer')\n")
try:
    f0()
except RuntimeError as error:
    ErrorHandler().record_exception(error)
pathlib.Path(sys.argv[1]).touch()  # tells rank 1 the error is written
if sys.argv[2] == "stuck":
    time.sleep(120)  # stuck in teardown until torchrun stops it
sys.exit(1)
"""
CULPRIT = """
import os, signal, sys, time
while not os.path.exists(sys.argv[1]):
    time.sleep(0.01)
time.sleep(1.1)  # a later second than the survivor's error
os.kill(os.getpid(), signal.SIGKILL)
"""


def _ended(pid: int) -> bool:
    """Whether the child `pid` has exited (a zombie: no one has reaped it yet)."""
    return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "Z"


def _torchrun_failure(tmp_path, survivor: str) -> tuple[str, FailureRecord, dict[int, int]]:
    """Run the two processes under torch's process context (looking at them every 0.1 s, torchrun's
    default); its summary text (as torchrun prints it), the failure's record, and each rank's pid.
    `survivor`: stuck (rank 0 hangs after writing its error) or exits (with code 1; the context's
    first look then waits until both processes have ended)."""
    from torch.distributed.elastic.multiprocessing import DefaultLogsSpecs, start_processes
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError

    written = tmp_path / "error-written"
    with stopped_processes() as stopped:
        context = start_processes(
            name="race_core.train.worker", entrypoint=sys.executable,
            args={0: ("-c", SURVIVOR, str(written), survivor), 1: ("-c", CULPRIT, str(written))}, envs={0: {}, 1: {}},
            logs_specs=DefaultLogsSpecs(log_dir=str(tmp_path / "logs")))
        pids = context.pids()
        if survivor == "exits":
            deadline = time.monotonic() + 120
            while not all(_ended(pid) for pid in pids.values()):
                assert time.monotonic() < deadline, "the two processes did not end"
                time.sleep(0.05)
        result = context.wait(timeout=60, period=0.1)
    assert result is not None and result.is_failed()
    summary = ChildFailedError("race_core.train.worker", result.failures).format_msg()
    return summary, FailureRecord.of(result.failures, stopped), pids


SPEC = dict(kind="sft", checkpoint="", data="", config={}, out_dir="", report="")


def test_the_rank_a_signal_killed_is_named_though_torchrun_blames_the_survivor_it_stopped(tmp_path):
    summary, record, pids = _torchrun_failure(tmp_path, "stuck")
    lines = summary.splitlines()
    root_cause = summary[summary.rfind("Root Cause"):]
    assert "rank      : 0" in root_cause and "exitcode  : -15" in root_cause  # torchrun blames rank 0
    assert "Connection closed by peer" in root_cause and len(lines) > TAIL_LINES  # rank 1 is above the tail

    assert record.stopped == [pids[0]]  # the agent's log record says it stopped rank 0
    assert [(f.rank, f.exitcode, f.pid) for f in record.failures] == [(0, -15, pids[0]), (1, -9, pids[1])]
    assert "Connection closed by peer" in record.failures[0].message  # rank 0's error file
    spec = LaunchSpec(**SPEC, options={"state_dir": str(tmp_path / "state"), "save_every": 2})
    first = failure_message(spec, 1, lines[-TAIL_LINES:], record).splitlines()[0]
    assert "rank 1 was killed by signal 9 (SIGKILL) (and rank 0 was stopped by torchrun)" in first, first
    assert "no training state was saved yet (one every 2 steps)" in first
    # without the record (a launcher that left none) the message names no one rather than guess
    assert ": rank" not in failure_message(spec, 1, lines[-TAIL_LINES:]).splitlines()[0]


def test_the_rank_a_signal_killed_is_named_though_a_survivor_exited_before_torchrun_looked(tmp_path):
    """The other side of the race: rank 0's collective broke and it exited (code 1) on its own, and
    torchrun saw both failures at one look; its root cause is rank 0 (the earlier error file)."""
    summary, record, pids = _torchrun_failure(tmp_path, "exits")
    root_cause = summary[summary.rfind("Root Cause"):]
    assert "rank      : 0" in root_cause and "exitcode  : 1 " in root_cause, root_cause
    assert record.stopped == []  # torchrun stopped no one: neither was alive when it looked
    assert record.failures[0].rank == 0  # torchrun's root cause first
    first = failure_message(LaunchSpec(**SPEC), 1, [], record).splitlines()[0]
    assert "rank 1 was killed by signal 9 (SIGKILL) (and rank 0 exited with code 1)" in first, first


RANKS = f"""
import os, sys
if os.environ["RANK"] == "0":
    sys.argv[2:] = ["stuck"]
    exec({SURVIVOR!r})
else:
    exec({CULPRIT!r})
"""


def test_the_launcher_writes_the_record_of_a_real_torchrun_failure(tmp_path):
    """`python -m race_core.train.elastic RECORD torchrun ...`, as `race_core.train.launch` runs it, on
    the stuck survivor's race: it fails as torchrun does and leaves the record that names rank 1."""
    script, record = tmp_path / "ranks.py", tmp_path / "run.failures.json"
    script.write_text(RANKS)
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    done = subprocess.run([sys.executable, "-m", "race_core.train.elastic", str(record), "torchrun", "--standalone",
                           "--nproc_per_node", "2", str(script), str(tmp_path / "error-written")],
                          capture_output=True, text=True, timeout=180, env=env)
    assert done.returncode != 0 and "ChildFailedError" in done.stderr, done.stderr[-2000:]
    kept = FailureRecord.read(record)
    assert {f.rank: f.exitcode for f in kept.failures} == {0: -15, 1: -9}, kept
    assert kept.stopped == [next(f.pid for f in kept.failures if f.rank == 0)]
    culprit, _ = kept.culprit()
    assert culprit is not None and culprit.rank == 1


def test_each_launch_command_runs_its_launcher_inside_the_recording_one(tmp_path):
    """torchrun and `accelerate launch` both run in `race_core.train.elastic`, with the arguments their
    own parsers take (the accelerate one is for GPUs, so it is parsed here rather than run)."""
    from accelerate.commands.launch import launch_command_parser
    from torch.distributed.run import get_args_parser

    from race_core.train.launch import launch_command, record_path

    spec = tmp_path / "spec.json"
    config = tmp_path / "accelerate.yaml"
    config.write_text("distributed_type: MULTI_GPU\nnum_machines: 1\nnum_processes: 2\n")
    for device, accelerate_config, launcher in (("cpu", "", "torchrun"), ("cuda", str(config), "accelerate")):
        command = launch_command(spec, 2, device, accelerate_config)
        assert command[1:5] == ["-m", "race_core.train.elastic", str(record_path(spec)), launcher], command
        parser = get_args_parser() if launcher == "torchrun" else launch_command_parser()
        args = parser.parse_args(command[5:])
        assert (args.module, args.training_script, args.training_script_args) == (
            True, "race_core.train.worker", [str(spec)])
