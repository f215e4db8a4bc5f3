"""Which rank a failed training run names, read from torchrun's own summary and log, made here by
torch's real process context (the one torchrun runs) on two real processes.

The race CI hit once: rank 1 was SIGKILLed; rank 0, whose collective broke when its peer died, wrote
its error file in the second before torchrun noticed the death; torchrun then stopped rank 0 with
SIGTERM and, ordering failures by their whole-second timestamps, called rank 0 the root cause. Here
the two processes play that order on purpose (rank 0 writes its error through torch's ErrorHandler,
rank 1 kills itself a second later), so the case no longer depends on the scheduler's timing. The
survivor's traceback is long, as a real one is, so the summary runs past the tail of output a
failure's message quotes: its reading has to come from every line."""

from __future__ import annotations

import logging
import sys
import time
from pathlib import Path

from race_core.train.launch import TAIL_LINES, TorchrunLog, failure_message
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


def _torchrun_failure(tmp_path, survivor: str) -> tuple[str, list[str], dict[int, int]]:
    """Run the two processes under torch's process context (looking at them every 0.1 s, torchrun's
    default); its summary text (as torchrun prints it), its log messages, and each rank's pid.
    `survivor`: stuck (rank 0 hangs after writing its error) or exits (with code 1; the context's
    first look then waits until both processes have ended)."""
    from torch.distributed.elastic.multiprocessing import DefaultLogsSpecs, start_processes
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError

    messages: list[str] = []
    written = tmp_path / "error-written"

    class Keep(logging.Handler):
        def emit(self, record):
            messages.append(record.getMessage())

    logger = logging.getLogger("torch.distributed.elastic.multiprocessing.api")
    keep = Keep(level=logging.WARNING)
    logger.addHandler(keep)
    try:
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
    finally:
        logger.removeHandler(keep)
    assert result is not None and result.is_failed()
    return ChildFailedError("race_core.train.worker", result.failures).format_msg(), messages, pids


def test_the_rank_a_signal_killed_is_named_though_torchrun_blames_the_survivor_it_stopped(tmp_path):
    summary, messages, pids = _torchrun_failure(tmp_path, "stuck")
    lines = summary.splitlines()
    root_cause = summary[summary.rfind("Root Cause"):]
    assert "rank      : 0" in root_cause and "exitcode  : -15" in root_cause  # torchrun blames rank 0
    assert "Connection closed by peer" in root_cause and len(lines) > TAIL_LINES  # rank 1 is above the tail

    torchrun = TorchrunLog()
    for line in [*messages, *lines]:
        torchrun.read(line)
    assert torchrun.stopped == {pids[0]}, messages  # torchrun's log says it stopped rank 0
    assert [failure[:2] for failure in torchrun.root + torchrun.others] == [(0, -15), (1, -9)]

    spec = LaunchSpec(kind="sft", checkpoint="", data="", config={}, out_dir="", report="",
                      options={"state_dir": str(tmp_path / "state"), "save_every": 2})
    tail = lines[-TAIL_LINES:]
    first = failure_message(spec, 1, tail, torchrun).splitlines()[0]
    assert "rank 1 was killed by signal 9 (SIGKILL) (and rank 0 was stopped by torchrun)" in first, first
    assert "no training state was saved yet (one every 2 steps)" in first
    # the tail alone holds neither failure's rank: read from it, the message could name no one
    assert ": rank" not in failure_message(spec, 1, tail).splitlines()[0]


def test_the_rank_a_signal_killed_is_named_though_a_survivor_exited_before_torchrun_looked(tmp_path):
    """The other side of the race: rank 0's collective broke and it exited (code 1) on its own, and
    torchrun saw both failures at one look; its root cause is rank 0 (the earlier error file)."""
    summary, messages, pids = _torchrun_failure(tmp_path, "exits")
    root_cause = summary[summary.rfind("Root Cause"):]
    assert "rank      : 0" in root_cause and "exitcode  : 1 " in root_cause, root_cause
    torchrun = TorchrunLog()
    for line in [*messages, *summary.splitlines()]:
        torchrun.read(line)
    assert not torchrun.stopped  # torchrun stopped no one: neither was alive when it looked
    spec = LaunchSpec(kind="rl", checkpoint="", data="", config={}, out_dir="", report="")
    first = failure_message(spec, 1, summary.splitlines()[-TAIL_LINES:], torchrun).splitlines()[0]
    assert "rank 1 was killed by signal 9 (SIGKILL) (and rank 0 exited with code 1)" in first, first
