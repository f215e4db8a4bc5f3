"""The Ray executor on a local Ray cluster of two nodes (`ray.cluster_utils.Cluster`), started inside a
fresh network namespace (`unshare -n`, `lo` up) so that every node is 127.0.0.1 and nothing leaves
the machine (tests/ray_cluster.py runs there). The cover's shards and the sample stage's chunks
done by the nodes' actors give the same bytes as one process; a node removed while its actor holds
a shard is recovered from: the shard goes to the other actor, the result is unchanged.
"""

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from race_core.config import Resources, RLConfig
from race_core.policy import checkpoint_digest
from storage import ArtifactStore
from tasks import stages, training_stages
from tasks.shards import SHARD_STAGE
from tasks.training_stages import PolicyRef

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[1]
SHARD_SIZE = 2
SAMPLE = {"tasks_per_iteration": 4, "group_size": 2, "sample_chunk": 1, "max_new_tokens": 48, "max_turns": 4}


def _needs_ray():
    try:
        import ray  # noqa: F401
    except ImportError:
        message = "Ray is not installed (pip install -e '.[ray]'; scripts/setup.sh installs it)"
        if os.environ.get("CI"):
            pytest.fail(message)
        pytest.skip(message)
    if shutil.which("unshare") is None or os.geteuid() != 0:
        pytest.skip("needs `unshare -n` as root: the Ray nodes run in a network namespace of their own")


@pytest.fixture(scope="module")
def one_process(tiny_checkpoint, tmp_path_factory):
    """The cover in this process (the local executor), on its own store."""
    from flows.cover import demo_inputs

    _needs_ray()
    home = tmp_path_factory.mktemp("ray-baseline")
    inputs = demo_inputs(home, n=8, seed=11)
    store = ArtifactStore(home / "store")
    trajectories = stages.ingest(store, inputs)["objects"]["trajectories"]
    cover = stages.cover(store, trajectories, str(tiny_checkpoint), checkpoint_digest(tiny_checkpoint),
                         resources=Resources(shard_size=SHARD_SIZE))
    return inputs, trajectories, cover["objects"]["decisions"]


def _on_cluster(tmp_path, inputs, trajectories, checkpoint, *extra) -> tuple[ArtifactStore, dict]:
    store = ArtifactStore(tmp_path / "store")
    assert stages.ingest(store, inputs)["objects"]["trajectories"] == trajectories
    out = tmp_path / "out.json"
    command = (f"ip link set lo up && exec {sys.executable} tests/ray_cluster.py {store.url} {checkpoint} "
               f"{trajectories} {SHARD_SIZE} {out} " + " ".join(extra))
    run = subprocess.run(["unshare", "-n", "sh", "-c", command], cwd=REPO, capture_output=True, text=True,
                         timeout=600, env={**os.environ, "RAY_USAGE_STATS_ENABLED": "0"})
    assert run.returncode == 0 and out.exists(), run.stdout[-3000:] + run.stderr[-5000:]
    result = json.loads(out.read_text())
    print(f"ray: cluster up in {result['cluster_s']} s, cover {result['cover_s']} s")
    assert "error" not in result, result
    return store, result


def _store_intact(store: ArtifactStore) -> None:
    for key in store.list_manifests(SHARD_STAGE):
        assert store.manifest_damage(store.read_manifest(SHARD_STAGE, key)) is None
    assert all(store.verify_object(digest) for digest in store.iter_objects())


def test_two_ray_nodes_decide_and_sample_as_one_process(one_process, tiny_checkpoint, smoke_policy, tmp_path):
    inputs, trajectories, decisions = one_process
    rollouts = training_stages.sample(ArtifactStore(tmp_path / "one"), PolicyRef.local(smoke_policy),
                                      RLConfig(**SAMPLE), Resources(), 0)["objects"]["rollouts"]
    store, result = _on_cluster(tmp_path, inputs, trajectories, tiny_checkpoint, "--sample", str(smoke_policy),
                                f"'{json.dumps(SAMPLE)}'")
    assert result["decisions"] == decisions  # the same bytes as the one-process cover
    assert result["rollouts"] == rollouts  # the same bytes as one process's chunks
    # both nodes' actors scored shards, each reading only its shard's rows
    ready = [line for line in result["log"] if line.startswith("cover: Ray actor ready on")]
    assert len(ready) == 2 and len(result["writers"]) == 2, result["log"]
    assert {w.split(":")[1] for w in result["writers"]} == {line.split(" on ")[1].split(" ")[0].split(":")[1]
                                                            for line in ready}
    assert all(0 < read <= store.fs.size(store.object_path(trajectories)) for read in result["read_bytes"])
    assert sum("sample: chunk" in line and "committed" in line for line in result["log"]) == 4
    _store_intact(store)


def test_a_ray_node_removed_mid_run_is_recovered_from(one_process, tiny_checkpoint, tmp_path):
    inputs, trajectories, decisions = one_process
    store, result = _on_cluster(tmp_path, inputs, trajectories, tiny_checkpoint, "--remove-node")
    assert result["removed_after"], result["log"]  # the second node went while its actor held a shard
    assert not any(f"committed by {result['removed_after']}" in line for line in result["log"])  # none of its own
    died = [line for line in result["log"] if "a Ray actor died doing shard" in line]
    assert len(died) == 1, result["log"]
    lost = died[0].split("doing shard ")[1].split(" ")[0]
    survivor = next(line.split(" on ")[1].split(" ")[0] for line in result["log"]
                    if "Ray actor ready on" in line and result["removed_after"] not in line)
    assert any(f"shard {lost} committed by {survivor}" in line for line in result["log"]), result["log"]
    assert result["decisions"] == decisions  # nothing lost, nothing twice
    _store_intact(store)


def test_the_ray_executor_without_ray_names_the_extra(tmp_path):
    code = ("import sys; sys.modules['ray'] = None\n"
            "from race_core.config import Resources\n"
            "from tasks.executors import executor_for\n"
            "executor_for(Resources(executor='ray')).run(None, [{'index': 0}], None, Resources(executor='ray'))\n")
    run = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert run.returncode != 0
    assert "ImportError: the ray executor needs Ray, which is not installed: pip install -e '.[ray]'" in run.stderr
