"""`race worker --pool race-gpu --device cuda:N`: one worker of the shard pool per device (docs/architecture.md §8).

It is `prefect worker start --pool POOL --type process --limit 1` with `RACE_DEVICE=DEVICE` in its
environment, which the child flow runs it starts inherit (`flows.shard` works on that device), and
`RACE_CHECKPOINT_CACHE` set to `.race/cache/checkpoints` under the folder it was started in (unless
set): each child run starts in a temporary folder of its own, and the model it fetches from the
store must outlive it, so the worker's child runs fetch a checkpoint once.
Limit 1: one child run, so one model, per device at a time. The process is replaced by the Prefect
worker (exec), so a signal to it reaches the worker and the runs it started.
"""

from __future__ import annotations

import os
import re
import socket
import sys

DEVICE = re.compile(r"^(cpu|cuda|cuda:\d+|mps)$")


def add_worker_parser(sub) -> None:
    from deployments import DEFAULT_POOL

    p = sub.add_parser("worker", help="a worker of the GPU pool: scores cover shards and plays sample chunks on one device")
    p.add_argument("--pool", default=DEFAULT_POOL, help=f"the process work pool (default: {DEFAULT_POOL})")
    p.add_argument("--device", required=True, help="the device this worker scores on: cuda:N, cuda, cpu")
    p.add_argument("--name", help="worker name (default: race-<host>-<device>)")
    p.add_argument("--limit", type=int, default=1, help="child runs at once (default: 1, one model per device)")
    p.set_defaults(func=cmd_worker)


def worker_command(pool: str, device: str, name: str | None = None, limit: int = 1) -> tuple[list[str], dict]:
    """The `prefect worker start` command line and environment of `race worker`."""
    from flows.shard import DEVICE_ENV
    from tasks.policy_ref import CACHE_ENV, checkpoint_cache

    if not DEVICE.match(device):
        raise ValueError(f"--device: {device!r} is not cpu, cuda, cuda:N or mps")
    if limit < 1:
        raise ValueError(f"--limit: {limit} is not >= 1")
    name = name or f"race-{socket.gethostname()}-{device.replace(':', '')}"
    argv = [sys.executable, "-m", "prefect", "worker", "start", "--pool", pool, "--type", "process",
            "--limit", str(limit), "--name", name]
    return argv, {**os.environ, DEVICE_ENV: device, CACHE_ENV: str(checkpoint_cache().resolve())}


def cmd_worker(args) -> int:
    if not os.environ.get("PREFECT_API_URL"):
        print("race worker: PREFECT_API_URL is not set; point it at the server `race serve` uses, e.g. "
              "export PREFECT_API_URL=http://HOST:4200/api", file=sys.stderr)
        return 2
    argv, env = worker_command(args.pool, args.device, args.name, args.limit)
    print(f"race worker: {' '.join(argv[1:])} with {env_line(args.device)}", file=sys.stderr, flush=True)
    os.execve(argv[0], argv, env)
    return 0  # not reached


def env_line(device: str) -> str:
    from flows.shard import DEVICE_ENV

    return f"{DEVICE_ENV}={device}"
