"""`race serve` outlives a Prefect server restart (issue 15): the server is stopped until `race serve`'s
log says the fault reached it (the runner's cancellation polling failed its tries, where unpatched
Prefect gives up, or the scheduled-run polling lost the server), then started again on the same port
and database; a run started and then cancelled through the API stops. The test waits on that log
line, not on a fixed sleep, so it neither passes without the fault on a slow machine nor idles on a
fast one."""

import asyncio
import os
import subprocess
import sys
import urllib.request

import pytest
from test_server import free_port, wait_until

pytestmark = pytest.mark.slow


def start_server(env, port, log):
    return subprocess.Popen([sys.executable, "-m", "prefect", "server", "start", "--host", "127.0.0.1", "--port",
                             str(port)], env=env, stdout=log, stderr=subprocess.STDOUT)


def healthy(api):
    try:
        return urllib.request.urlopen(f"{api}/health", timeout=2).status == 200
    except OSError:
        return False


def test_an_error_of_losing_the_server_is_told_from_one_that_is_not():
    """`race serve` serves again after the runner stops for losing the server even when the server
    answers by the time the runner's error arrives (seen in CI: the runner's scheduled-run polling gave
    up while the test restarted the server, the error came after, and `race serve` raised it and exited)."""
    import builtins

    import httpx
    from prefect.utilities.services import critical_service_loop

    from flows.serve import server_loss

    # built in from 3.11; anyio raises the backport's on 3.10
    group = getattr(builtins, "ExceptionGroup", None) or pytest.importorskip("exceptiongroup").ExceptionGroup

    async def refused():
        raise httpx.ConnectError("All connection attempts failed")

    with pytest.raises(RuntimeError) as gave_up:  # Prefect's own service loop, giving up as the runner's does
        asyncio.run(critical_service_loop(refused, interval=0, consecutive=2, printer=lambda *_: None))
    assert "exceeded error threshold" in str(gave_up.value)
    nested = group("runner", [group("poller", [gave_up.value])])
    assert server_loss(nested) is gave_up.value  # the one the warning names
    try:
        try:
            raise httpx.ConnectError("refused")
        except httpx.ConnectError as refused_error:
            cause = refused_error
            raise RuntimeError("while registering the deployments")  # noqa: B904 - the context is the point
    except RuntimeError as during:
        assert server_loss(group("runner", [during])) is cause
    assert server_loss(group("runner", [ValueError("bad deployment parameters")])) is None
    assert server_loss(RuntimeError("a flow's own error")) is None


def fault_seen(log: str) -> bool:
    return "cancellation polling failed" in log or "lost the Prefect server" in log


def test_a_run_cancelled_after_a_server_restart_stops(tmp_path, tiny_checkpoint, demo_inputs):
    port = free_port()
    api = f"http://127.0.0.1:{port}/api"
    env = {**os.environ, "PREFECT_HOME": str(tmp_path / "prefect"), "PREFECT_SERVER_ANALYTICS_ENABLED": "false",
           "PREFECT_UI_ENABLED": "false"}
    env.pop("PREFECT_API_URL", None)
    server_log = open(tmp_path / "server.log", "a")
    server = start_server(env, port, server_log)
    serve = None
    serve_log = open(tmp_path / "serve.log", "w")
    from prefect.settings import PREFECT_API_URL, temporary_settings

    settings = temporary_settings({PREFECT_API_URL: api})
    settings.__enter__()
    try:
        wait_until(lambda: healthy(api), 180, "the Prefect server")
        serve = subprocess.Popen(
            [sys.executable, "-m", "flows.cli", "serve", "--checkpoint", str(tiny_checkpoint), "--store",
             str(tmp_path / "store"), "--inbox", str(tmp_path / "inbox" / "*.jsonl"), "--allow-root", str(tmp_path),
             str(tiny_checkpoint)],
            env={**env, "PREFECT_API_URL": api}, stdout=serve_log,
            stderr=subprocess.STDOUT)
        from prefect.client.orchestration import get_client
        from prefect.client.schemas.objects import StateType
        from prefect.deployments import run_deployment
        from prefect.states import Cancelling

        async def read_deployment():
            async with get_client() as client:
                try:
                    return await client.read_deployment_by_name("race-pipeline/manual")
                except Exception:  # noqa: BLE001 - not registered yet
                    return None

        deployment = wait_until(lambda: asyncio.run(read_deployment()), 120, "race serve to register")

        server.terminate()  # the fault: the server goes away for a while
        server.wait(30)
        log_path = tmp_path / "serve.log"
        wait_until(lambda: fault_seen(log_path.read_text()), 240, "race serve to see the server gone")
        assert serve.poll() is None, (tmp_path / "serve.log").read_text()[-3000:]
        server = start_server(env, port, server_log)
        wait_until(lambda: healthy(api), 180, "the Prefect server to come back")

        config = deployment.parameters["config"]
        long_run = {**config, "inputs": demo_inputs, "stages": ["ingest", "validate", "cover", "compress", "sft"],
                    "sft": {**config["sft"], "steps": 1_000_000}}
        flow_run = run_deployment("race-pipeline/manual", timeout=0, parameters={"config": long_run})

        async def state_of(run_id):
            async with get_client() as client:
                return (await client.read_flow_run(run_id)).state

        wait_until(lambda: asyncio.run(state_of(flow_run.id)).type == StateType.RUNNING, 180, "the run to start")

        async def cancel():
            async with get_client() as client:
                await client.set_flow_run_state(flow_run.id, Cancelling(), force=True)

        asyncio.run(cancel())
        final = wait_until(lambda: (s := asyncio.run(state_of(flow_run.id))).type == StateType.CANCELLED and s, 120,
                           "the cancelled run to stop")
        assert final.type == StateType.CANCELLED
        assert serve.poll() is None
        # the fault did happen: the runner's polling failed while the server was away (unpatched,
        # Prefect stops watching for cancellations there, or the runner stops altogether)
        assert fault_seen(log_path.read_text())
    finally:
        settings.__exit__(None, None, None)
        if serve is not None:
            serve.terminate()
            serve.wait(30)
        server.terminate()
        server.wait(30)
        server_log.close()
        serve_log.close()
