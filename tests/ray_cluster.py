"""Helper of tests/test_ray.py, run inside a fresh network namespace (`unshare -n`, `lo` up) so that
every Ray node is 127.0.0.1: a local Ray cluster of two nodes (`ray.cluster_utils.Cluster`, N CPUs
each, by default as many as a process of this machine computes with), on which the cover and the
sample stage run with `--executor ray`.

    python tests/ray_cluster.py STORE CHECKPOINT TRAJECTORIES SHARD_SIZE OUT.json [--remove-node] [--cpus N] [--sample POLICY CONFIG_JSON]

With --remove-node, the second node is removed while the cover runs, while its actor holds its first
shard. Writes what happened to OUT.json.

Which actor starts first, and how many units it does before the other is up, is the loaded host's
choice: on a CI host busy with other tests one actor did all four shards before the second had
loaded. So no actor starts a unit until both are ready (`_both_ready_first`, a hold injected
on purpose through Ray's worker set-up hook, not part of the executor): every node's actor then has
units to do, in any order.
"""

from __future__ import annotations

import json
import logging
import sys
import tempfile
import threading
import time


class _Lines(logging.Handler):
    """Keeps the messages of the records it is given (the stages' log lines, for OUT.json)."""

    def __init__(self, lines: list[str]):
        super().__init__()
        self.lines = lines

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(record.getMessage())


def main(argv: list[str]) -> int:
    import ray
    from ray.cluster_utils import Cluster

    from race_core.config import CoverConfig, Resources, RLConfig
    from race_core.policy import checkpoint_digest
    from storage import ArtifactStore
    from tasks import stages, training_stages
    from tasks.shards import SHARD_STAGE
    from tasks.training_stages import PolicyRef

    store_url, checkpoint, trajectories, shard_size, out = argv[:5]
    remove = "--remove-node" in argv
    started = time.monotonic()
    cpus = int(argv[argv.index("--cpus") + 1]) if "--cpus" in argv else 2
    node_args = {"num_cpus": cpus, "object_store_memory": 80 * 2**20}
    cluster = Cluster(initialize_head=True, head_node_args={**node_args, "include_dashboard": False})
    barrier = tempfile.mkdtemp(prefix="ray-ready-")
    ray.init(address=cluster.address, log_to_driver=False,  # this driver on the head node, before another joins
             runtime_env={"worker_process_setup_hook": _both_ready_first(barrier, 2)})
    second = cluster.add_node(**node_args)
    cluster.wait_for_nodes()
    result: dict = {"cluster_s": round(time.monotonic() - started, 1), "log": []}
    logging.getLogger("tasks").addHandler(_Lines(result["log"]))
    logging.getLogger("tasks").setLevel(logging.INFO)
    store = ArtifactStore(store_url)
    resources = Resources(executor="ray", shard_size=int(shard_size), pickup_timeout=120)
    try:
        outcome: dict = {}

        def cover() -> None:
            try:
                outcome["manifest"] = stages.cover(store, trajectories, checkpoint, checkpoint_digest(checkpoint),
                                                   CoverConfig(), resources)
            except BaseException as exc:  # noqa: BLE001 - reported to the test
                outcome["error"] = repr(exc)

        began = time.monotonic()
        runner = threading.Thread(target=cover)
        runner.start()
        if remove:
            result["removed_after"] = _remove_when_busy(cluster, second, runner, result["log"])
        runner.join()
        result["cover_s"] = round(time.monotonic() - began, 1)
        if "error" in outcome:
            result["error"] = outcome["error"]
        else:
            manifest = outcome["manifest"]
            result["decisions"] = manifest["objects"]["decisions"]
            keys = store.list_manifests(SHARD_STAGE)
            result["writers"] = sorted({store.read_manifest(SHARD_STAGE, k)["created_by"] for k in keys})
            result["read_bytes"] = [store.read_manifest(SHARD_STAGE, k)["metrics"]["read_bytes"] for k in keys]
        if "--sample" in argv:
            at = argv.index("--sample")
            policy, config = argv[at + 1], RLConfig(**json.loads(argv[at + 2]))
            sampled = training_stages.sample(store, PolicyRef.local(policy), config, resources, 0)
            result["rollouts"] = sampled["objects"]["rollouts"]
    finally:
        ray.shutdown()
        cluster.shutdown()
    with open(out, "w") as fh:
        json.dump(result, fh, indent=1)
    return 0


def _both_ready_first(barrier: str, actors: int, wait_s: float = 120.0):
    """Ray's set-up hook of each worker process: the executor's actor marks `barrier` when it is ready,
    and no unit starts (waiting at most `wait_s`) until `actors` actors have. A hold injected by this
    test, so that the split of the units between the nodes does not depend on their start times."""

    def hook() -> None:
        import os
        import time

        from tasks.executors import ray as executor

        actor, ready, do = executor.UnitActor, executor.UnitActor.ready, executor.UnitActor.do

        def marked_ready(self) -> str:
            open(os.path.join(barrier, str(os.getpid())), "w").close()
            return ready(self)

        def held_do(self, unit, force):
            until = time.monotonic() + wait_s
            while len(os.listdir(barrier)) < actors and time.monotonic() < until:
                time.sleep(0.05)
            return do(self, unit, force)

        actor.ready, actor.do = marked_ready, held_do

    return hook


def _remove_when_busy(cluster, node, runner: threading.Thread, log: list[str]) -> str:
    """Remove `node` a second after its actor is ready: the executor gives a ready actor a unit at
    once, and a first unit (the model load, then scoring) takes longer than that, so the actor is
    holding a shard when its node goes. Returns the actor's host:pid."""
    while runner.is_alive():
        ready = [line for line in list(log) if "Ray actor ready on" in line and node.node_id in line]
        if ready:
            time.sleep(1.0)
            cluster.remove_node(node)
            return ready[0].split(" on ")[1].split(" ")[0]
        time.sleep(0.1)
    return ""


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
