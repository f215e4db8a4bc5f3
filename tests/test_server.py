"""Against a real Prefect server on loopback: `race serve` serves the deployments, a run of
race-pipeline/manual created through the API reaches Completed, the nightly one has its cron."""

import asyncio
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


@pytest.fixture
def prefect_server(tmp_path):
    port = free_port()
    env = {**os.environ, "PREFECT_HOME": str(tmp_path / "prefect"), "PREFECT_SERVER_ANALYTICS_ENABLED": "false",
           "PREFECT_UI_ENABLED": "false"}
    env.pop("PREFECT_API_URL", None)
    log = open(tmp_path / "server.log", "w")
    server = subprocess.Popen([sys.executable, "-m", "prefect", "server", "start", "--host", "127.0.0.1",
                               "--port", str(port)], env=env, stdout=log, stderr=subprocess.STDOUT)
    api = f"http://127.0.0.1:{port}/api"

    def healthy():
        try:
            return urllib.request.urlopen(f"{api}/health", timeout=2).status == 200
        except OSError:
            return server.poll() is not None and pytest.fail((tmp_path / "server.log").read_text())

    try:
        wait_until(healthy, 180, "the Prefect server")
        yield api, env
    finally:
        server.terminate()
        server.wait(30)
        log.close()


def test_served_deployments_run_from_the_api(prefect_server, tiny_checkpoint, demo_inputs, tmp_path):
    api, env = prefect_server
    env = {**env, "PREFECT_API_URL": api, "RACE_RETRY_DELAY_S": "0"}
    store = str(tmp_path / "store")
    log = open(tmp_path / "serve.log", "w")
    serve = subprocess.Popen([sys.executable, "-m", "flows.cli", "serve", "--checkpoint", str(tiny_checkpoint),
                              "--store", store, "--inbox", str(tmp_path / "inbox" / "*.jsonl"),
                              "--allow-root", str(tmp_path), str(tiny_checkpoint)],
                             env=env, stdout=log, stderr=subprocess.STDOUT, cwd=os.getcwd())
    from prefect.settings import PREFECT_API_URL, temporary_settings

    # The session's test harness (if another test started it) points this process at its own
    # server; talk to ours explicitly.
    settings = temporary_settings({PREFECT_API_URL: api})
    settings.__enter__()
    try:
        from prefect.client.orchestration import get_client
        from prefect.deployments import run_deployment

        async def deployment(name):
            async with get_client() as client:
                try:
                    return await client.read_deployment_by_name(name)
                except Exception:  # noqa: BLE001 - not registered yet
                    return None

        def both_registered():
            if serve.poll() is not None:
                pytest.fail((tmp_path / "serve.log").read_text())
            return asyncio.run(deployment("race-nightly/nightly")) and asyncio.run(deployment("race-pipeline/manual"))

        wait_until(both_registered, 120, "race serve to register the deployments")
        nightly = asyncio.run(deployment("race-nightly/nightly"))
        crons = [s.schedule.cron for s in nightly.schedules]
        assert crons == ["0 2 * * *"]
        assert nightly.schedules[0].schedule.timezone == "UTC"

        # the UI's form: the deployment's own defaults, edited in place (here: inputs and stages)
        manual = asyncio.run(deployment("race-pipeline/manual"))
        config = manual.parameters["config"]
        assert config["checkpoint"] == str(tiny_checkpoint) and config["store"] == store
        assert set(config) >= {"ingest", "cover", "resources", "sft", "rl", "evaluate"}
        form = manual.parameter_openapi_schema
        assert form["properties"]["config"], form
        run = run_deployment("race-pipeline/manual", timeout=300, poll_interval=2, parameters={
            "config": {**config, "inputs": demo_inputs, "stages": ["ingest", "validate", "cover", "compress"]}})
        assert run.state.is_completed(), (run.state, (tmp_path / "serve.log").read_text()[-3000:])
        assert any(True for _ in (tmp_path / "store" / "stages" / "compress").glob("*.json"))
        # a run that asks to read a URL outside the served roots fails before reading anything
        refused = run_deployment("race-pipeline/manual", timeout=120, poll_interval=2, parameters={
            "config": {**config, "inputs": ["http://127.0.0.1:9/secrets.jsonl"], "stages": ["ingest"]}})
        assert refused.state.is_failed()
        assert "outside the roots this server allows" in (tmp_path / "serve.log").read_text()
    finally:
        settings.__exit__(None, None, None)
        serve.terminate()
        serve.wait(30)
        log.close()
