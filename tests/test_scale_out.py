"""Scale-out on loopback: a real `prefect server start`, a moto S3 server as the store, `race serve`
(the pool and its `race-units` deployment, by module entrypoint) and two `race worker` processes on
CPU, each started in a working folder of its own, with no checkpoint: the model reaches them only
as an object of the store. `race run --pool race-gpu` scores the cover's shards as child flow runs
on the workers: the decisions object is the one-process cover's, byte for byte, and both workers
fetched the model (once each) and scored shards. Then a run during which one worker's process group
is SIGKILLed while its child run holds a lease: the run completes, the dead worker's shards scored
on the other one, each shard committed once, every object in the store intact. Then the sample
stage's chunks played on the pool: the same rollouts as one process. Last, the parent's side alone:
child runs of tiny units past the server's page (the server and every client here read at most
PAGE runs at once, PREFECT_API_DEFAULT_LIMIT, so 2.5 pages are 50 child runs rather than 500), and
child runs that no worker takes (the run fails saying so)."""

import json
import logging
import os
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest
from test_server import free_port, wait_until

from race_core.config import CoverConfig, Resources
from race_core.policy import checkpoint_digest
from storage import ArtifactStore, read_dataset_from_store
from tasks import stages
from tasks.policy_ref import STORED_STAGE
from tasks.shards import SHARD_STAGE, plan_shards, shard_key, shard_scope
from tasks.units import UnitJob, UnitWorker, commit_record

PAGE = 20  # flow runs per read, of the loopback server and its clients (PREFECT_API_DEFAULT_LIMIT)
CHILDREN = 50  # child runs of the paging test: 2.5 pages

pytestmark = pytest.mark.slow

BUCKET = "race-test"
SHARD_SIZE = 2
REPO = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def loopback(tmp_path_factory, tiny_checkpoint):
    """moto S3 + Prefect server + `race serve`; yields (env for race processes, tmp folder)."""
    import boto3

    tmp = tmp_path_factory.mktemp("scale-out")
    s3_port, api_port = free_port(), free_port()
    endpoint, api = f"http://127.0.0.1:{s3_port}", f"http://127.0.0.1:{api_port}/api"
    env = {**os.environ, "PREFECT_HOME": str(tmp / "prefect"), "PREFECT_SERVER_ANALYTICS_ENABLED": "false",
           "PREFECT_UI_ENABLED": "false", "AWS_ACCESS_KEY_ID": "x", "AWS_SECRET_ACCESS_KEY": "x",
           "AWS_DEFAULT_REGION": "us-east-1", "AWS_ENDPOINT_URL": endpoint, "FSSPEC_S3_ENDPOINT_URL": endpoint,
           "PREFECT_WORKER_QUERY_SECONDS": "2", "RACE_RETRY_DELAY_S": "0", "HF_HUB_OFFLINE": "1",
           "PREFECT_API_DEFAULT_LIMIT": str(PAGE),
           "TOKENIZERS_PARALLELISM": "false"}
    for name in ("PREFECT_API_URL", "RACE_ALLOWED_ROOTS", "AWS_SESSION_TOKEN", "AWS_PROFILE"):
        env.pop(name, None)
    logs: list = []
    procs: list[subprocess.Popen] = []
    patch = pytest.MonkeyPatch()

    def start(name: str, argv: list[str], **extra) -> subprocess.Popen:
        logs.append(open(tmp / f"{name}.log", "w"))
        procs.append(subprocess.Popen(argv, env={**env, **extra}, stdout=logs[-1], stderr=subprocess.STDOUT,
                                      cwd=REPO, start_new_session=True))
        return procs[-1]

    try:
        start("moto", [str(Path(sys.executable).parent / "moto_server"), "-H", "127.0.0.1", "-p", str(s3_port)])
        start("server", [sys.executable, "-m", "prefect", "server", "start", "--host", "127.0.0.1", "--port",
                         str(api_port)])
        wait_until(lambda: _answers(f"{endpoint}/"), 60, "the moto S3 server")
        boto3.client("s3", endpoint_url=endpoint, region_name="us-east-1", aws_access_key_id="x",
                     aws_secret_access_key="x").create_bucket(Bucket=BUCKET)
        wait_until(lambda: _answers(f"{api}/health"), 180, "the Prefect server")
        env["PREFECT_API_URL"] = api
        for name in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_DEFAULT_REGION", "AWS_ENDPOINT_URL",
                     "FSSPEC_S3_ENDPOINT_URL"):  # this process reads the store too
            patch.setenv(name, env[name])
        patch.delenv("AWS_SESSION_TOKEN", raising=False)
        serve = start("serve", [sys.executable, "-m", "flows.cli", "serve", "--checkpoint", str(tiny_checkpoint),
                                "--store", f"s3://{BUCKET}/served", "--inbox", str(tmp / "inbox" / "*.jsonl")])
        wait_until(lambda: serve.poll() is not None and pytest.fail(_tail(tmp / "serve.log")) or
                   "work pool 'race-gpu'" in (tmp / "serve.log").read_text(), 180, "race serve to deploy the pool")
        yield env, tmp
    finally:
        for proc in reversed(procs):
            _kill(proc)
        for log in logs:
            log.close()
        patch.undo()


def _answers(url: str) -> bool:
    try:
        return urllib.request.urlopen(url, timeout=2).status == 200
    except OSError:
        return False


def _kill(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        proc.wait(30)


def _tail(path: Path, n: int = 4000) -> str:
    return path.read_text()[-n:] if path.exists() else f"({path} not written)"


@pytest.fixture(scope="module")
def baseline(tiny_checkpoint, tmp_path_factory):
    """The one-process cover (no Prefect) of the same input at the same shard size."""
    from flows.cover import demo_inputs

    home = tmp_path_factory.mktemp("baseline")
    inputs = demo_inputs(home, n=8, seed=11)
    store = ArtifactStore(home / "store")
    ingested = stages.ingest(store, inputs)
    manifest = stages.cover(store, ingested["objects"]["trajectories"], str(tiny_checkpoint),
                            checkpoint_digest(tiny_checkpoint), resources=Resources(shard_size=SHARD_SIZE))
    decisions = read_dataset_from_store(store, manifest["objects"]["decisions"], "decisions")
    print(f"one-process cover: {manifest['wall_s']} s (model load included)")
    return inputs, manifest["objects"]["decisions"], decisions


def _workers(processes, n: int = 2) -> list[subprocess.Popen]:
    """`race worker`s, each in a working folder of its own (its checkpoint cache lands there)."""
    started = []
    for i in range(n):
        home = processes.tmp / f"{processes.name}-worker{i}"
        home.mkdir()
        started.append(processes.start(f"worker{i}", [sys.executable, "-m", "flows.cli", "worker", "--pool",
                                                      "race-gpu", "--device", "cpu", "--name",
                                                      f"w{i}-{time.monotonic_ns()}"], cwd=home))
    return started


def _fetched(processes, folder: str) -> list[bool]:
    """For each worker: did it fetch the checkpoint object `folder` into its own cache?"""
    return [(processes.tmp / f"{processes.name}-worker{i}" / ".race" / "cache" / "checkpoints" / folder /
             ".complete").exists() for i in range(2)]


def _race_run(env, inputs, checkpoint, store_url: str, log: Path, pool_shards: int,
              lease_timeout: int) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-m", "flows.cli", "run", "--input", *inputs, "--checkpoint", str(checkpoint),
         "--store", store_url, "--stages", "ingest", "validate", "cover", "compress", "--shard-size",
         str(SHARD_SIZE), "--pool", "race-gpu", "--pool-shards", str(pool_shards), "--lease-timeout", str(lease_timeout)],
        env=env, stdout=open(log, "w"), stderr=subprocess.STDOUT, cwd=REPO, start_new_session=True)


def _summary(log: Path) -> dict:
    text = log.read_text()
    return json.loads(text[text.index("{\n"):])


def _check_store(store: ArtifactStore, scope: str, expected_keys: set[str]) -> None:
    """Each shard committed once, under its content key; every object's bytes hash to its name."""
    shard_keys = set(store.list_manifests(SHARD_STAGE))
    assert shard_keys == expected_keys
    for key in shard_keys:
        manifest = store.read_manifest(SHARD_STAGE, key)
        assert manifest["key"] == key and store.manifest_damage(manifest) is None
    objects = list(store.iter_objects())
    assert objects and all(store.verify_object(digest) for digest in objects)


class _Processes:
    """Processes started for one test, each logging to a file; all killed at the end."""

    def __init__(self, env: dict, tmp: Path, name: str):
        self.env, self.tmp, self.name, self.logs, self.procs = env, tmp, name, [], []

    def start(self, label: str, argv: list[str], cwd: Path = REPO) -> subprocess.Popen:
        self.logs.append(open(self.tmp / f"{self.name}-{label}.log", "w"))
        env = {k: v for k, v in self.env.items() if k != "RACE_CHECKPOINT_CACHE"}
        self.procs.append(subprocess.Popen(argv, env=env, stdout=self.logs[-1], stderr=subprocess.STDOUT,
                                           cwd=cwd, start_new_session=True))
        return self.procs[-1]

    def tails(self) -> str:
        return "".join(_tail(Path(log.name)) for log in self.logs)

    def stop(self) -> None:
        for proc in self.procs:
            _kill(proc)
        for log in self.logs:
            log.close()


def _run_with_workers(loopback, baseline, tiny_checkpoint, name: str, pool_shards: int, kill: bool):
    env, tmp = loopback
    inputs, _, _ = baseline
    processes = _Processes(env, tmp, name)
    store = ArtifactStore(f"s3://{BUCKET}/{name}")
    run_log = tmp / f"{name}-run.log"
    workers = _workers(processes)
    started = time.monotonic()
    # a run where no worker dies gives its children a lease timeout no loaded CI host reaches (a late beat
    # there would submit a shard twice); the kill test keeps a short one, so that death is seen quickly
    run = _race_run(env, inputs, tiny_checkpoint, store.url, run_log, pool_shards, 20 if kill else 240)
    killed = None
    try:
        if kill:  # the first child run to hold a lease: SIGKILL its worker's process group
            def a_lease():
                assert run.poll() is None, _tail(run_log)
                return store.fs.glob(f"{store.root}/leases/*.json")

            lease = json.loads(store.fs.cat_file(wait_until(a_lease, 180, "a child run's lease")[0]))
            group = os.getpgid(lease["pid"])
            killed = next(w for w in workers if w.pid == group)
            os.killpg(group, signal.SIGKILL)
            killed.wait(30)
        run.wait(300)
        wall = time.monotonic() - started
        assert run.returncode == 0, _tail(run_log) + processes.tails()
    finally:
        _kill(run)
        processes.stop()
    return processes, store, run_log, wall, killed, run.pid


def _ingested(store: ArtifactStore) -> str:
    [ingest_key] = store.list_manifests("ingest")
    return store.read_manifest("ingest", ingest_key)["objects"]["trajectories"]


def _expected(store: ArtifactStore, summary: dict, checkpoint) -> tuple[str, set[str]]:
    digest = checkpoint_digest(checkpoint)
    scope = shard_scope(CoverConfig(), Resources(), digest)
    return scope, {shard_key(scope, s) for s in plan_shards(store, _ingested(store), SHARD_SIZE)}


def test_a_run_spread_over_two_workers_decides_as_one_process(loopback, baseline, tiny_checkpoint):
    # two shards per child run: two child runs, one per worker (each takes one at a time), a round of
    # process starts instead of two
    processes, store, run_log, wall, _, run_pid = _run_with_workers(loopback, baseline, tiny_checkpoint, "pool", 2,
                                                                    kill=False)
    summary = _summary(run_log)
    _, decisions_digest, decisions = baseline
    assert summary["objects"]["decisions"] == decisions_digest  # the same bytes as the one-process cover
    pooled = read_dataset_from_store(store, summary["objects"]["decisions"], "decisions")
    assert pooled[["trajectory_id", "turn", "accepted"]].equals(decisions[["trajectory_id", "turn", "accepted"]])
    scope, keys = _expected(store, summary, tiny_checkpoint)
    assert len(keys) == 4
    _check_store(store, scope, keys)
    log = run_log.read_text()
    assert log.count("submitted to pool 'race-gpu'") == 2, log[-3000:]  # one child run per two shards
    assert "cover: 2 of 2 child run(s) done on pool 'race-gpu'" in log, log[-3000:]
    # the model reached the workers only through the store: each fetched it once into its own folder
    folder = store.read_manifest(STORED_STAGE, checkpoint_digest(tiny_checkpoint))["objects"]["checkpoint"]
    assert _fetched(processes, folder) == [True, True]  # both workers ran child runs
    # the shards were written by the workers' two child runs, not by `race run` itself, each read alone
    manifests = [store.read_manifest(SHARD_STAGE, k) for k in keys]
    writers = {m["created_by"] for m in manifests}
    assert len(writers) == 2 and str(run_pid) not in {w.split(":")[1] for w in writers}
    # each read its rows alone: on this 8-row object (one row group) its footer and that row group,
    # nearly all of it (tests/test_shards.py: a larger object, a fraction)
    size = store.fs.size(store.object_path(_ingested(store)))
    assert all(0 < m["metrics"]["read_bytes"] <= size for m in manifests), [m["metrics"] for m in manifests]
    print(f"pool run: {wall:.1f} s wall, shards written by {sorted(writers)}")


def test_a_worker_killed_mid_run_leaves_a_complete_uncorrupted_result(loopback, baseline, tiny_checkpoint):
    _, store, run_log, wall, killed, _ = _run_with_workers(loopback, baseline, tiny_checkpoint, "kill", 2,
                                                           kill=True)
    assert killed is not None and killed.returncode == -signal.SIGKILL
    summary = _summary(run_log)
    _, decisions_digest, decisions = baseline
    assert summary["objects"]["decisions"] == decisions_digest
    pooled = read_dataset_from_store(store, summary["objects"]["decisions"], "decisions")
    assert not pooled.duplicated(["trajectory_id", "turn"]).any()  # no shard twice in the result
    scope, keys = _expected(store, summary, tiny_checkpoint)
    _check_store(store, scope, keys)
    log = run_log.read_text()
    assert "is taken for dead; its shards go again" in log, log[-4000:]  # the lease expired: resubmitted
    print(f"kill run: {wall:.1f} s wall")


SAMPLE_CONFIG = {"tasks_per_iteration": 4, "group_size": 2, "sample_chunk": 2, "max_new_tokens": 48, "max_turns": 4}
POOL_SAMPLE = """
import json, logging, sys
from race_core.config import Resources, RLConfig
from storage import ArtifactStore
from tasks import training_stages
from tasks.training_stages import PolicyRef
logging.basicConfig(format="%(message)s")
logging.getLogger("tasks").setLevel(logging.INFO)
manifest = training_stages.sample(ArtifactStore(sys.argv[1]), PolicyRef.local(sys.argv[2]), RLConfig(**json.loads(sys.argv[3])),
                                  Resources(pool="race-gpu", lease_timeout=240), 0)
print(json.dumps(manifest["objects"]))
"""


def test_sample_chunks_played_on_the_pool_are_the_rollouts_of_one_process(loopback, smoke_policy, tmp_path):
    from race_core.config import RLConfig
    from tasks import training_stages
    from tasks.chunks import CHUNK_STAGE
    from tasks.training_stages import PolicyRef

    env, tmp = loopback
    one = training_stages.sample(ArtifactStore(tmp_path / "store"), PolicyRef.local(smoke_policy),
                                 RLConfig(**SAMPLE_CONFIG), Resources(), 0)
    processes = _Processes(env, tmp, "sample")
    store = ArtifactStore(f"s3://{BUCKET}/sample")
    try:
        _workers(processes)
        started = time.monotonic()
        run = processes.start("run", [sys.executable, "-c", POOL_SAMPLE, store.url, str(smoke_policy),
                                      json.dumps(SAMPLE_CONFIG)])
        assert run.wait(300) == 0, processes.tails()
        wall = time.monotonic() - started
    finally:
        processes.stop()
    log = (tmp / "sample-run.log").read_text()
    pooled = json.loads(log.strip().splitlines()[-1])["rollouts"]
    if pooled == one["objects"]["rollouts"]:
        print("pooled rollouts: byte-identical to one process's")
    else:  # the documented alternative: the same episodes, log-probs apart by at most 10x the kernels' noise
        noise = _thread_noise(smoke_policy, RLConfig(**SAMPLE_CONFIG))
        difference = _first_difference(ArtifactStore(tmp_path / "store"), store, one, pooled, 10 * noise)
        print(f"pooled rollouts: not byte-identical; the same episodes with log-probs within 10 x {noise:.2e}, the "
              "difference one process measures between thread counts")
        assert noise > 0 and difference is None, difference or "rollouts differ, yet no kernel noise was measured"
    assert log.count("submitted to pool 'race-gpu'") == 2, log[-3000:]  # one child run per chunk
    records = [store.read_record(f"stages/{CHUNK_STAGE}/{name}") for name in store.list_records(f"stages/{CHUNK_STAGE}")]
    assert len(records) == 2 and all(r["created_by"].split(":")[1] != str(run.pid) for r in records)
    assert len({r["created_by"] for r in records}) == 2  # two child runs, one per chunk
    assert not store.fs.glob(f"{store.root}/leases/*.json")  # the children removed their leases
    print(f"pooled sample: {wall:.1f} s wall, chunks written by {sorted(r['created_by'] for r in records)}")


def _thread_noise(policy, config) -> float:
    """The largest log-prob difference between playing chunk 0 with this process's threads and with
    one thread: how far the CPU kernels' float sums move when a process computes with another
    thread count (the one way a worker process computes otherwise than this one)."""
    import torch

    from race_core.policy import load_policy
    from race_core.rollout import sample_rollouts

    model, tokenizer = load_policy(policy)
    threads = torch.get_num_threads()
    default = sample_rollouts(model, tokenizer, config, 0, chunk=0)
    torch.set_num_threads(1)
    try:
        single = sample_rollouts(model, tokenizer, config, 0, chunk=0)
    finally:
        torch.set_num_threads(threads)
    return max((abs(x - y) for a, b in zip(default, single, strict=True) if a.token_ids == b.token_ids
                for x, y in zip(a.old_logprobs, b.old_logprobs, strict=True)), default=0.0)


def _first_difference(local: ArtifactStore, pool: ArtifactStore, one: dict, pooled: str, tolerance: float
                      ) -> str | None:
    """Where the pool's rollouts first differ from one process's, or None: the same episodes (tasks,
    tokens, roles, rewards) with log-probs at most `tolerance` apart."""
    from race_core.rollout import rollouts_from_json

    ours = rollouts_from_json(local.get_bytes(one["objects"]["rollouts"]).decode("utf-8"))
    theirs = rollouts_from_json(pool.get_bytes(pooled).decode("utf-8"))
    if len(ours) != len(theirs):
        return f"{len(theirs)} rollouts from the pool, {len(ours)} from one process"
    for a, b in zip(ours, theirs, strict=True):
        for name in vars(a):
            x, y = getattr(a, name), getattr(b, name)
            if name == "old_logprobs" and len(x) == len(y) and max(map(abs, map(float.__sub__, x, y)),
                                                                   default=0) <= tolerance:
                continue
            if x != y:
                return f"rollout group {a.group} sample {a.sample_index}: {name} differs: {str(x)[:400]} vs {str(y)[:400]}"
    return None


# -- the parent's side alone: paging through many children, children no worker takes ------------
class NoteJob(UnitJob):
    """Tiny units for the parent's tests: a unit commits a small record, no model."""

    kind, what, noun = "note", "note", "notes"

    def __init__(self, scope: str):
        self.scope = scope

    def spec(self) -> dict:
        return {"scope": self.scope}

    @classmethod
    def from_spec(cls, spec: dict) -> "NoteJob":
        return cls(spec["scope"])

    def committed(self, store, unit):
        return store.read_record(f"stages/note/{self.scope}-{unit['index']}.json")

    def worker(self, store, device, publish=None, planned=None):
        job = self

        class Worker(UnitWorker):
            def do(self, unit, force=False):
                ours = commit_record(store, f"stages/note/{job.scope}-{unit['index']}.json", {"unit": unit}, force)
                return {"committed": ours, "skipped": False, "read_bytes": 0, "load_s": 0.0}

        return Worker()


@pytest.fixture
def parent_side(loopback, monkeypatch):
    """This process as a client of the loopback server (its page size too), with the `note` unit kind known."""
    from prefect.settings import PREFECT_API_DEFAULT_LIMIT, PREFECT_API_URL, temporary_settings

    from tasks.units import UNIT_KINDS

    env, _ = loopback
    monkeypatch.setitem(UNIT_KINDS, "note", f"{__name__}:NoteJob")
    with temporary_settings({PREFECT_API_URL: env["PREFECT_API_URL"], PREFECT_API_DEFAULT_LIMIT: PAGE}):
        yield


def _carry(pool: str, store: ArtifactStore, done) -> int:
    """Plays the pool's workers (instead of a process start per child run): each child run
    of `race-units/<pool>` that is scheduled is set Running, its units done by the job's own worker
    (`tasks.units.job_from_spec`, as the child flow does), then set Completed."""
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import (
        DeploymentFilter,
        DeploymentFilterName,
        FlowRunFilter,
        FlowRunFilterState,
        FlowRunFilterStateType,
    )
    from prefect.client.schemas.objects import StateType
    from prefect.states import Completed, Running

    from tasks.units import job_from_spec

    carried = 0
    with get_client(sync_client=True) as client:
        while not done():
            for run in client.read_flow_runs(
                    deployment_filter=DeploymentFilter(name=DeploymentFilterName(any_=[pool])),
                    flow_run_filter=FlowRunFilter(state=FlowRunFilterState(type=FlowRunFilterStateType(
                        any_=[StateType.SCHEDULED]))), limit=PAGE):
                client.set_flow_run_state(run.id, Running(), force=True)
                worker = job_from_spec(run.parameters["kind"], run.parameters["spec"]).worker(store, "cpu")
                for unit in run.parameters["units"]:
                    worker.do(unit)
                client.set_flow_run_state(run.id, Completed(), force=True)
                carried += 1
            time.sleep(0.5)
    return carried


def test_a_parent_follows_child_runs_past_the_servers_page(parent_side, tmp_path, caplog):
    import contextvars
    import threading

    from flows.serve import prepare_pool
    from tasks.executors.pool import PoolExecutor, page_size

    caplog.set_level(logging.INFO, logger="tasks.executors.pool")
    prepare_pool("race-paging")
    store, outcome = ArtifactStore(tmp_path / "store"), {}
    units = [{"index": i} for i in range(CHILDREN)]
    assert page_size() == PAGE and len(units) > 2 * PAGE  # three reads a round: two whole pages and a part

    def parent() -> None:
        try:
            PoolExecutor().run(NoteJob("p"), units, store, Resources(pool="race-paging", pickup_timeout=120))
        except BaseException as exc:  # noqa: BLE001 - reported below
            outcome["error"] = exc

    started = time.monotonic()
    thread = threading.Thread(target=contextvars.copy_context().run, args=(parent,))  # this server's settings
    thread.start()
    carried = _carry("race-paging", store, lambda: not thread.is_alive())
    thread.join()
    assert "error" not in outcome, outcome.get("error")
    lines = [record.getMessage() for record in caplog.records if record.name == "tasks.executors.pool"]
    assert carried == CHILDREN and len(store.list_records("stages/note")) == CHILDREN
    assert f"note: {CHILDREN} of {CHILDREN} child run(s) done on pool 'race-paging'" in lines[-1], lines[-3:]
    assert not any("go again" in line for line in lines)  # no child was taken for lost and resubmitted
    print(f"{CHILDREN} child runs followed in {time.monotonic() - started:.0f} s")


def test_child_runs_no_worker_takes_fail_the_run_saying_so(parent_side, tmp_path):
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import DeploymentFilter, DeploymentFilterName

    from flows.serve import prepare_pool
    from tasks.executors import UnitsFailed
    from tasks.executors.pool import PoolExecutor

    prepare_pool("race-idle")
    started = time.monotonic()
    with pytest.raises(UnitsFailed, match=r"no worker of pool 'race-idle' took any of 3 waiting child run\(s\) in "
                                          r"\d+ s \(resources.pickup_timeout\), and none is online: start `race "
                                          r"worker --pool race-idle"):
        PoolExecutor().run(NoteJob("idle"), [{"index": i} for i in range(3)], ArtifactStore(tmp_path / "store"),
                           Resources(pool="race-idle", pickup_timeout=6))
    assert time.monotonic() - started < 60
    with get_client(sync_client=True) as client:
        runs = client.read_flow_runs(deployment_filter=DeploymentFilter(name=DeploymentFilterName(any_=["race-idle"])))
    assert len(runs) == 3 and all(r.state.is_cancelled() for r in runs)  # none left to start later
