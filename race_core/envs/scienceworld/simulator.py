"""ScienceWorld's simulators for `race_core.envs.scienceworld.world`: one JVM each (the package's
`ScienceWorldEnv`), stepped without listing the valid actions, from a bounded pool shared by a process's
episodes (`POOL`). An episode that gave its simulator up replays its commands when it gets one back:
the pool decides where an episode plays, never what it sees."""

from __future__ import annotations

import atexit
import logging
import os
import shutil
import threading
from collections import OrderedDict
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

SIMULATORS_VARIABLE = "RACE_SCIENCEWORLD_SIMULATORS"
INSTALL_HINT = ("pip install 'race-pipeline[scienceworld]' and a Java runtime (Debian: apt-get install "
                "default-jre-headless)")
JVM_BYTES = 1.5 * 2**30  # what one simulator is counted as against the machine's free memory (1.1 GB resident)

logger = logging.getLogger(__name__)


def _scienceworld():
    try:
        from scienceworld import ScienceWorldEnv
    except ImportError as exc:
        raise ImportError(f"--env scienceworld needs the scienceworld package: {INSTALL_HINT}") from exc
    if shutil.which("java") is None:
        raise RuntimeError(f"--env scienceworld needs a Java runtime (`java` is not on PATH): {INSTALL_HINT}")
    return ScienceWorldEnv


def version() -> str:
    from importlib.metadata import version as installed

    return installed("scienceworld")


class Simulator:
    """One ScienceWorld simulator (a JVM): load a task's variation, step a command, read the score."""

    def __init__(self):
        science_world = _scienceworld()
        self.env = science_world("", envStepLimit=10**9)
        self.loaded: tuple[str, int] | None = None
        self.holder: Any = None  # the episode whose world this is (SimulatorPool)

    def load(self, task_type: str, variation: int) -> None:
        self.env.load(task_type, variation, "", generateGoldPath=False)
        self.loaded = (task_type, variation)

    def gold(self, task_type: str, variation: int) -> list[str]:
        """The gold path the simulator makes for the variation now (it may differ from one load to the next)."""
        self.env.load(task_type, variation, "", generateGoldPath=True)
        self.loaded = None  # its world is at the start, but load() again to be sure
        return [str(command) for command in self.env.server.getGoldActionSequence()]

    def step(self, command: str) -> tuple[str, int, bool]:
        """(observation, score 0-100 or negative, completed) of one command; the valid actions not listed."""
        server = self.env.server
        observation = str(server.step(command))
        return observation, int(round(100 * server.getScore())), bool(server.getCompleted())

    def look(self) -> str:
        return str(self.env.server.freeActionLook())  # takes no time in the simulated world

    def task_description(self) -> str:
        return str(self.env.server.freeActionTaskDesc())

    def variations(self, task_type: str) -> dict[str, list[int]]:
        self.env.load(task_type, 0, "")
        self.loaded = None
        return {"train": [int(v) for v in self.env.get_variations_train()],
                "test": [int(v) for v in self.env.get_variations_test()]}

    def close(self) -> None:
        try:
            self.env.close()
        except Exception as exc:  # noqa: BLE001 - a JVM already gone is closed
            logger.debug(f"closing a ScienceWorld simulator: {exc}")


def default_simulators() -> int:
    """`$RACE_SCIENCEWORLD_SIMULATORS`, else as many as the free memory holds (`JVM_BYTES` each), at most
    the cores and at most 8."""
    if value := os.environ.get(SIMULATORS_VARIABLE):
        try:
            size = int(value)
        except ValueError:
            size = 0
        if size < 1:
            raise ValueError(f"{SIMULATORS_VARIABLE} must be a whole number of at least 1, got {value!r}")
        return size
    try:
        free = os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError, AttributeError):
        free = 4 * JVM_BYTES
    return max(1, min(8, os.cpu_count() or 1, int(free // JVM_BYTES)))


class SimulatorPool:
    """At most `size` simulators for all the episodes of a process. `acquire(holder)` gives the holder its
    simulator (fresh: True when the holder must load its task and replay its commands first); when every
    simulator is held, the holder that stepped longest ago gives its up. Callers hold `lock` from acquire to
    the end of their step."""

    def __init__(self, size: int | None = None):
        self._size = size
        self.lock = threading.RLock()
        self.idle: list[Simulator] = []
        self.held: OrderedDict[int, Simulator] = OrderedDict()  # id(holder) -> its simulator
        self.started = 0

    @property
    def size(self) -> int:
        return self._size or default_simulators()

    def acquire(self, holder: Any) -> tuple[Simulator, bool]:
        with self.lock:
            key = id(holder)
            if key in self.held and self.held[key].holder is holder:
                self.held.move_to_end(key)
                return self.held[key], False
            if (stale := self.held.pop(key, None)) is not None:  # a holder gone whose id is taken again
                stale.holder = None
                self.idle.append(stale)
            if self.idle:
                simulator = self.idle.pop()
            elif len(self.held) < self.size:
                simulator = Simulator()
                self.started += 1
            else:
                _, simulator = self.held.popitem(last=False)  # the longest idle holder replays when it comes back
            simulator.holder = holder
            self.held[key] = simulator
            return simulator, True

    def release(self, holder: Any) -> None:
        with self.lock:
            simulator = self.held.get(id(holder))
            if simulator is not None and simulator.holder is holder:
                del self.held[id(holder)]
                simulator.holder = None
                self.idle.append(simulator)

    @contextmanager
    def borrowed(self) -> Iterator[Simulator]:
        """A simulator for one piece of work (a task's record, a replay), given back after."""
        token = object()
        with self.lock:
            simulator, _ = self.acquire(token)
            try:
                yield simulator
            finally:
                self.release(token)

    def close(self) -> None:
        with self.lock:
            for simulator in (*self.idle, *self.held.values()):
                simulator.close()
            self.idle.clear()
            self.held.clear()


POOL = SimulatorPool()
atexit.register(POOL.close)
