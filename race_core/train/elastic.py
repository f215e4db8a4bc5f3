"""The launcher process of a training run: torchrun (or `accelerate launch`) run in this process, with
what it knows of a failure kept as data.

    python -m race_core.train.elastic RECORD.json torchrun ARGS...
    python -m race_core.train.elastic RECORD.json accelerate ARGS...

When the training processes fail, torch's elastic agent raises `ChildFailedError` holding one
`ProcessFailure` per failed rank (its pid, exit code, the time and message of the error file its
`@record`-decorated entry wrote, `race_core.train.worker.main`), and logs each process it stops
because another failed. Both are written to RECORD.json (`FailureRecord`) before the error goes on as
torchrun's would (its summary printed, a non-zero exit), so the caller (`race_core.train.launch`)
names the failed rank from facts, not from the summary's text. A launch that fails elsewhere (the
launcher itself, or a DeepSpeed multi-host launch through pdsh) leaves no record.
"""

from __future__ import annotations

import json
import logging
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

AGENT_LOGGER = "torch.distributed.elastic.multiprocessing.api"  # the process context's logger
CLOSING = "Sending process %s closing signal %s"  # its message (format and arguments) for each process it stops


@dataclass(frozen=True)
class Failure:
    rank: int
    pid: int
    exitcode: int  # minus the signal that killed it
    timestamp: int  # seconds: of its error file, else of when the agent saw it end
    message: str  # its error file's message, or the agent's word for a signal


@dataclass
class FailureRecord:
    """A failed launch: its failures, torchrun's root cause first (the earliest error), and the pids of
    the processes it stopped because another had failed."""

    failures: list[Failure] = field(default_factory=list)
    stopped: list[int] = field(default_factory=list)

    @classmethod
    def of(cls, failures: dict[int, Any], stopped: set[int]) -> FailureRecord:
        """From a `ChildFailedError`'s failures (global rank -> `ProcessFailure`)."""
        kept = [Failure(rank, f.pid, f.exitcode, f.timestamp, _text(f.message)) for rank, f in sorted(failures.items())]
        root = min(kept, key=lambda failure: failure.timestamp) if kept else None  # as ChildFailedError's first
        return cls([failure for failure in kept if failure is root] + [f for f in kept if f is not root],
                   sorted(stopped))

    def write(self, path: str | Path) -> None:
        Path(path).write_text(json.dumps(asdict(self)))

    @classmethod
    def read(cls, path: str | Path) -> FailureRecord:
        """The record at `path`; an empty one where the launch left none."""
        path = Path(path)
        if not path.is_file():
            return cls()
        data = json.loads(path.read_text())
        return cls([Failure(**failure) for failure in data["failures"]], list(data["stopped"]))

    def culprit(self) -> tuple[Failure | None, list[Failure]]:
        """The failed process that took the run down, and the others that failed. torchrun's root cause
        is the failure it saw first, to the second: a survivor whose collective broke when its peer
        died can write its error in the second before torchrun notices the death, then be stopped by
        torchrun. So the culprit is a process torchrun did not stop, one an outside signal killed
        first (its peers only see it gone), else torchrun's root cause."""
        own = [failure for failure in self.failures if failure.pid not in self.stopped]
        for group in ([failure for failure in own if failure.exitcode < 0], own, self.failures):
            if group:
                return group[0], [failure for failure in self.failures if failure is not group[0]]
        return None, []


def _text(message: Any) -> str:
    """An error file's message (a string, or a dict holding one) as one string."""
    return str(message.get("message", message)) if isinstance(message, dict) else str(message)


class _Stopped(logging.Handler):
    """Keeps the pid of every process the agent's context stops (the arguments of its CLOSING record)."""

    def __init__(self) -> None:
        super().__init__(level=logging.DEBUG)
        self.pids: set[int] = set()

    def emit(self, record: logging.LogRecord) -> None:
        if record.msg == CLOSING and record.args:
            self.pids.add(int(record.args[0]))


@contextmanager
def stopped_processes() -> Iterator[set[int]]:
    """The pids the elastic agent stops while the block runs (its logger's records, kept at any level)."""
    import torch.distributed.elastic.multiprocessing.api  # noqa: F401  (sets its logger's level first)

    logger = logging.getLogger(AGENT_LOGGER)
    handler, level = _Stopped(), logger.level
    logger.addHandler(handler)
    if logger.getEffectiveLevel() > logging.WARNING:
        logger.setLevel(logging.WARNING)
    try:
        yield handler.pids
    finally:
        logger.removeHandler(handler)
        logger.setLevel(level)


def _launch(launcher: str, args: list[str]) -> None:
    if launcher == "torchrun":
        from torch.distributed.run import main

        main(args)
    elif launcher == "accelerate":
        from accelerate.commands.launch import launch_command, launch_command_parser

        launch_command(launch_command_parser().parse_args(args))
    else:
        raise ValueError(f"unknown launcher {launcher!r}: expected torchrun or accelerate")


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) < 2:
        print("usage: python -m race_core.train.elastic RECORD.json torchrun|accelerate ARGS...", file=sys.stderr)
        return 2
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError

    record, launcher, rest = args[0], args[1], args[2:]
    with stopped_processes() as stopped:
        try:
            _launch(launcher, rest)
        except ChildFailedError as error:
            FailureRecord.of(error.failures, stopped).write(record)
            raise
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
