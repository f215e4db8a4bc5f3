"""Scaling benchmark: the same cover workload on 1 and 2 workers for each executor (docs/architecture.md §8).

    python -m bench.scaling [--executors local pool ray] [--workers 1 2] [--units 4] [--unit-seconds 30]

The workload is synthetic (`bench.workload`) and sized so that one unit (a cover shard) takes about
`--unit-seconds` on one worker: the scorer is timed on a probe shard first, with one thread. Every
worker computes with one thread (`OMP_NUM_THREADS=1` for pool workers, `num_cpus=1` for Ray
actors, `torch.set_num_threads(1)` for the local run), so N workers use N cores. Each configuration
runs on a fresh store (nothing cached). For each it prints the wall time, the speed-up over one
worker of the same executor, the model loads and their time, the scoring time per unit, the other
overhead per unit ((wall x workers - scoring - model loads) / units: process start, scheduling,
reading, committing, idle workers), and the bytes of trajectories each worker process read; and
whether every configuration's decisions object is the same bytes.

The pool configuration starts its own Prefect server and `race worker`s on 127.0.0.1, the Ray one a
Ray of this machine: on a machine whose network is closed, run the whole benchmark inside a fresh
network namespace (`unshare -n sh -c 'ip link set lo up && python -m bench.scaling ...'`).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import shutil
import subprocess
import sys
import time
from collections import defaultdict
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from bench.workload import MODELS, Workload, checkpoint_for, synthetic_trajectories

POOL = "race-bench"
EXECUTORS = ("local", "pool", "ray")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.scaling", description=__doc__.split("\n\n")[0])
    p.add_argument("--executors", nargs="+", choices=EXECUTORS, default=list(EXECUTORS))
    p.add_argument("--workers", nargs="+", type=int, default=[1, 2], help="worker counts (the first is the baseline)")
    p.add_argument("--units", type=int, default=4, help="cover shards in the workload")
    p.add_argument("--unit-seconds", type=float, default=30.0, help="scoring time of one unit on one worker")
    p.add_argument("--model", choices=MODELS, default="tiny")
    p.add_argument("--turns", type=int, default=Workload.turns)
    p.add_argument("--out", default=".race/bench-scaling", help="checkpoints, stores and the report go here")
    p.add_argument("--json", help="write the results here (default: OUT/scaling.json)")
    args = p.parse_args(argv)
    os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")
    out = Path(args.out).resolve()
    checkpoint = checkpoint_for(args.model, str(out / "checkpoints"))
    workload = Workload(turns=args.turns)
    per_trajectory = _probe(checkpoint, workload)
    shard_size = max(1, math.ceil(args.unit_seconds / per_trajectory))
    inputs = _write_inputs(out, checkpoint, workload, shard_size * args.units)
    print(f"scaling: {args.units} unit(s) of {shard_size} trajectories (~{shard_size * per_trajectory:.1f} s each "
          f"on one thread: {per_trajectory:.2f} s per trajectory measured) on {args.model}", file=sys.stderr)
    rows = []
    for executor in args.executors:
        counts = [1] if executor == "local" else args.workers
        with _environment(executor, out, checkpoint) as start_workers:
            for n in counts:
                rows.append(_run(executor, n, out, checkpoint, inputs, shard_size, start_workers))
    result = {"model": args.model, "units": args.units, "shard_size": shard_size, "unit_seconds": args.unit_seconds,
              "seconds_per_trajectory": per_trajectory, "rows": rows,
              "same_decisions": len({r["decisions"] for r in rows}) == 1}
    Path(args.json or out / "scaling.json").write_text(json.dumps(result, indent=2))
    print(format_rows(rows))
    print(f"decisions object the same bytes in every configuration: {result['same_decisions']}")
    return 0


def _probe(checkpoint: Path, workload: Workload) -> float:
    """Seconds of cover scoring per trajectory, one thread, on a probe of 4 trajectories."""
    import torch

    from race_core.cover import logic_cover
    from race_core.render import Renderer
    from race_core.scoring import make_scorer

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        scorer = make_scorer("hf", str(checkpoint))
        probe = synthetic_trajectories(Renderer(scorer.renderer.tokenizer), Workload(**{**workload.__dict__, "n": 4}))
        logic_cover(probe[:1], scorer)  # warm
        began = time.perf_counter()
        logic_cover(probe, scorer)
        return (time.perf_counter() - began) / len(probe)
    finally:
        torch.set_num_threads(threads)


def _write_inputs(out: Path, checkpoint: Path, workload: Workload, n: int) -> list[str]:
    from race_core.policy import load_tokenizer
    from race_core.render import Renderer

    path = out / "data" / f"synthetic-{n}-{workload.turns}.jsonl"
    if not path.exists():
        path.parent.mkdir(parents=True, exist_ok=True)
        trajectories = synthetic_trajectories(Renderer(load_tokenizer(checkpoint)),
                                              Workload(**{**workload.__dict__, "n": n}))
        path.write_text("".join(json.dumps(t.to_dict()) + "\n" for t in trajectories))
    return [str(path)]


@contextmanager
def _environment(executor: str, out: Path, checkpoint: Path):
    """What an executor needs running: a Prefect server, and `race serve` (which creates the pool and
    deploys its child flow) (pool). Yields a function that starts N workers and returns a stop function."""
    if executor != "pool":
        yield lambda n: (lambda: None)
        return
    from prefect.settings import PREFECT_API_URL, temporary_settings

    home, port = out / "prefect", _free_port()
    api = f"http://127.0.0.1:{port}/api"
    env = {**os.environ, "PREFECT_HOME": str(home), "PREFECT_API_URL": api, "PREFECT_UI_ENABLED": "false",
           "PREFECT_WORKER_QUERY_SECONDS": "1", "OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false"}
    server = subprocess.Popen([sys.executable, "-m", "prefect", "server", "start", "--host", "127.0.0.1", "--port",
                               str(port)], env={k: v for k, v in env.items() if k != "PREFECT_API_URL"},
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    serving = None
    try:
        _wait_for(f"{api}/health", 180)
        serve_log = out / "serve.log"
        with open(serve_log, "w") as log:
            serving = subprocess.Popen([sys.executable, "-m", "flows.cli", "serve", "--checkpoint", str(checkpoint),
                                        "--store", str(out / "served"), "--pool", POOL], env=env, stdout=log,
                                       stderr=subprocess.STDOUT, start_new_session=True)
        _wait_for_line(serve_log, f"work pool {POOL!r}", serving, 180)

        def start_workers(n: int):
            workers = []
            for i in range(n):
                folder = out / f"pool-worker{i}"
                shutil.rmtree(folder, ignore_errors=True)
                folder.mkdir(parents=True)
                workers.append(subprocess.Popen(
                    [sys.executable, "-m", "flows.cli", "worker", "--pool", POOL, "--device", "cpu", "--name",
                     f"bench-{i}-{time.monotonic_ns()}"], env=env, cwd=folder, stdout=subprocess.DEVNULL,
                    stderr=subprocess.DEVNULL, start_new_session=True))

            def stop() -> None:
                for worker in workers:
                    os.killpg(worker.pid, 9)
                    worker.wait()
            return stop

        with temporary_settings({PREFECT_API_URL: api}):  # this process's stages submit to that server
            yield start_workers
    finally:
        for process in (serving, server):
            if process is not None:
                os.killpg(process.pid, 9)
                process.wait()


def _run(executor: str, n: int, out: Path, checkpoint: Path, inputs: list[str], shard_size: int,
         start_workers) -> dict[str, Any]:
    import torch

    from race_core.config import Resources
    from race_core.policy import checkpoint_digest
    from storage import ArtifactStore
    from tasks import stages

    folder = out / f"store-{executor}-{n}"
    shutil.rmtree(folder, ignore_errors=True)
    store = ArtifactStore(folder)
    trajectories = stages.ingest(store, inputs)["objects"]["trajectories"]
    resources = {"local": Resources(shard_size=shard_size),
                 "pool": Resources(shard_size=shard_size, pool=POOL, pool_shards=1, lease_timeout=600),
                 "ray": Resources(shard_size=shard_size, executor="ray", ray_actors=n)}[executor]
    stop = start_workers(n)
    threads = torch.get_num_threads()
    try:
        if executor == "ray":
            import ray

            ray.init(num_cpus=n, include_dashboard=False, log_to_driver=False)
        if executor == "local":
            torch.set_num_threads(1)
        began = time.perf_counter()
        manifest = stages.cover(store, trajectories, str(checkpoint), checkpoint_digest(checkpoint),
                                resources=resources)
        wall = time.perf_counter() - began
    finally:
        torch.set_num_threads(threads)
        stop()
        if executor == "ray":
            ray.shutdown()
    return {"executor": executor, "workers": n, "wall_s": round(wall, 1), "decisions": manifest["objects"]["decisions"],
            **_unit_figures(store, n, wall)}


def _unit_figures(store, n: int, wall: float) -> dict[str, Any]:
    from tasks.shards import SHARD_STAGE

    metrics = [store.read_manifest(SHARD_STAGE, key) for key in store.list_manifests(SHARD_STAGE)]
    per_writer: dict[str, int] = defaultdict(int)
    for m in metrics:
        per_writer[m["created_by"]] += m["metrics"]["read_bytes"]
    score = sum(m["metrics"]["score_s"] for m in metrics)
    loads = [m["metrics"]["load_s"] for m in metrics if m["metrics"]["load_s"] > 0]
    units = len(metrics)
    return {"units": units, "score_s_per_unit": round(score / units, 2), "model_loads": len(loads),
            "load_s_each": round(sum(loads) / max(len(loads), 1), 2),
            "other_s_per_unit": round((wall * n - score - sum(loads)) / units, 2),
            "read_bytes_per_worker": dict(sorted(per_writer.items())),
            "trajectories_bytes": _trajectories_size(store)}


def _trajectories_size(store) -> int:
    [key] = store.list_manifests("ingest")
    return store.fs.size(store.object_path(store.read_manifest("ingest", key)["objects"]["trajectories"]))


def format_rows(rows: list[dict[str, Any]]) -> str:
    """The results as a markdown table; speed-up is over one worker of the same executor."""
    base = {r["executor"]: r["wall_s"] for r in rows if r["workers"] == min(x["workers"] for x in rows
                                                                          if x["executor"] == r["executor"])}
    lines = ["| executor | workers | wall s | speed-up | model loads (s each) | scoring s/unit | other s/unit | "
             "bytes read per worker (of the trajectories' bytes) |", "|---|---|---|---|---|---|---|---|"]
    for r in rows:
        read = ", ".join(f"{b:,}" for b in r["read_bytes_per_worker"].values())
        lines.append(f"| {r['executor']} | {r['workers']} | {r['wall_s']} | {base[r['executor']] / r['wall_s']:.2f}x | "
                     f"{r['model_loads']} ({r['load_s_each']}) | {r['score_s_per_unit']} | {r['other_s_per_unit']} | "
                     f"{read} (of {r['trajectories_bytes']:,}) |")
    return "\n".join(lines)


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _wait_for_line(log: Path, line: str, process: subprocess.Popen, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while line not in log.read_text():
        if process.poll() is not None or time.monotonic() > deadline:
            raise RuntimeError(f"race serve did not deploy the pool ({log}): {log.read_text()[-2000:]}")
        time.sleep(1)


def _wait_for(url: str, timeout: float) -> None:
    import urllib.request

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            if urllib.request.urlopen(url, timeout=2).status == 200:
                return
        except OSError:
            time.sleep(1)
    raise TimeoutError(f"{url} did not answer in {timeout:.0f} s")


if __name__ == "__main__":
    raise SystemExit(main())
