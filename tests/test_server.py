"""Against a real Prefect server on loopback: `race serve` serves the deployments, a run of
race-pipeline/manual created through the API reaches Completed, the nightly one has its cron, and
two nightly runs started at once run one after the other."""

import asyncio
import json
import os
import socket
import subprocess
import sys
import time
import urllib.request

import pytest


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_until(predicate, timeout: float, what: str):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(1)
    raise TimeoutError(f"timed out waiting for {what}")


@pytest.fixture(scope="module")
def served(tmp_path_factory, tiny_checkpoint):
    """A Prefect server on loopback and `race serve` serving its deployments to it (one per module):
    (api, root folder, serve log). The served runs write under root: store/, inbox/."""
    root = tmp_path_factory.mktemp("served")
    (root / "inbox").mkdir()
    port = free_port()
    env = {**os.environ, "PREFECT_HOME": str(root / "prefect"), "PREFECT_SERVER_ANALYTICS_ENABLED": "false",
           "PREFECT_UI_ENABLED": "false"}
    env.pop("PREFECT_API_URL", None)
    api = f"http://127.0.0.1:{port}/api"
    server_log, serve_log = open(root / "server.log", "w"), open(root / "serve.log", "w")
    server = subprocess.Popen([sys.executable, "-m", "prefect", "server", "start", "--host", "127.0.0.1",
                               "--port", str(port)], env=env, stdout=server_log, stderr=subprocess.STDOUT)
    serve = None

    def healthy():
        try:
            return urllib.request.urlopen(f"{api}/health", timeout=2).status == 200
        except OSError:
            return server.poll() is not None and pytest.fail((root / "server.log").read_text())

    from prefect.settings import PREFECT_API_URL, temporary_settings

    # The session's test harness (if another test started it) points this process at its own
    # server; talk to ours explicitly.
    settings = temporary_settings({PREFECT_API_URL: api})
    settings.__enter__()
    try:
        wait_until(healthy, 180, "the Prefect server")
        serve = subprocess.Popen([sys.executable, "-m", "flows.cli", "serve", "--checkpoint", str(tiny_checkpoint),
                                  "--store", str(root / "store"), "--inbox", str(root / "inbox" / "*.jsonl"),
                                  "--allow-root", str(root), str(tiny_checkpoint)],
                                 env={**env, "PREFECT_API_URL": api, "RACE_RETRY_DELAY_S": "0"}, stdout=serve_log,
                                 stderr=subprocess.STDOUT, cwd=os.getcwd())

        def both_registered():
            if serve.poll() is not None:
                pytest.fail((root / "serve.log").read_text())
            return asyncio.run(deployment("race-nightly/nightly")) and asyncio.run(deployment("race-pipeline/manual"))

        wait_until(both_registered, 120, "race serve to register the deployments")
        yield api, root, root / "serve.log"
    finally:
        settings.__exit__(None, None, None)
        for process in (serve, server):
            if process is not None:
                process.terminate()
                process.wait(30)
        server_log.close()
        serve_log.close()


async def deployment(name):
    from prefect.client.orchestration import get_client

    async with get_client() as client:
        try:
            return await client.read_deployment_by_name(name)
        except Exception:  # noqa: BLE001 - not registered yet
            return None


def test_served_deployments_run_from_the_api(served, tiny_checkpoint):
    from prefect.deployments import run_deployment

    from flows.cover import demo_inputs

    api, root, serve_log = served
    inputs = demo_inputs(root / "home", n=8, seed=11)  # inside the served roots
    nightly = asyncio.run(deployment("race-nightly/nightly"))
    crons = [s.schedule.cron for s in nightly.schedules]
    assert crons == ["0 2 * * *"]
    assert nightly.schedules[0].schedule.timezone == "UTC"

    # the UI's form: the deployment's own defaults, edited in place (here: inputs and stages)
    manual = asyncio.run(deployment("race-pipeline/manual"))
    config = manual.parameters["config"]
    assert config["checkpoint"] == str(tiny_checkpoint) and config["store"] == str(root / "store")
    assert set(config) >= {"ingest", "cover", "resources", "sft", "rl", "evaluate"}
    form = manual.parameter_openapi_schema
    assert form["properties"]["config"], form
    run = run_deployment("race-pipeline/manual", timeout=300, poll_interval=2, parameters={
        "config": {**config, "inputs": inputs, "stages": ["ingest", "validate", "cover", "compress"]}})
    assert run.state.is_completed(), (run.state, serve_log.read_text()[-3000:])
    assert any(True for _ in (root / "store" / "stages" / "compress").glob("*.json"))
    # a run that asks to read a URL outside the served roots fails before reading anything
    refused = run_deployment("race-pipeline/manual", timeout=120, poll_interval=2, parameters={
        "config": {**config, "inputs": ["http://127.0.0.1:9/secrets.jsonl"], "stages": ["ingest"]}})
    assert refused.state.is_failed()
    assert "outside the roots this server allows" in serve_log.read_text()


def test_two_nightly_runs_started_together_run_one_after_the_other(served, tiny_checkpoint):
    """Started at the same moment, the second waits for the first (the deployment's concurrency
    limit), so it finds the first's part in the catalog: one part holds every trajectory. Run side
    by side, both would score the inbox and append overlapping parts."""
    from prefect.client.orchestration import get_client
    from prefect.deployments import run_deployment

    from race_core.config import CoverConfig, Resources
    from race_core.envs.expert import expert_dataset
    from race_core.policy import checkpoint_digest
    from storage import ArtifactStore, Catalog
    from tasks.stages import catalog_scope

    api, root, serve_log = served
    trajectories = expert_dataset(4, seed=5)
    (root / "inbox" / "night.jsonl").write_text("".join(json.dumps(t.to_dict()) + "\n" for t in trajectories))
    started = [run_deployment("race-nightly/nightly", timeout=0) for _ in range(2)]

    async def read(run_id):
        async with get_client() as client:
            return await client.read_flow_run(run_id)

    def all_final():
        runs = [asyncio.run(read(r.id)) for r in started]
        return runs if all(r.state.is_final() for r in runs) else None

    runs = wait_until(all_final, 600, "both nightly runs to end")
    assert all(r.state.is_completed() for r in runs), ([r.state for r in runs], serve_log.read_text()[-3000:])
    first, second = sorted(runs, key=lambda r: r.start_time)
    print(f"nightly runs: {first.start_time} - {first.end_time}, then {second.start_time} - {second.end_time}")
    assert second.start_time >= first.end_time  # they did not overlap

    scope = catalog_scope(checkpoint_digest(tiny_checkpoint), CoverConfig(), Resources())
    parts = Catalog(ArtifactStore(str(root / "store"))).parts(scope)
    assert len(parts) == 1 and sorted(parts[0]["ids"]) == sorted(t.id for t in trajectories)
