"""Resume after a SIGKILL at other points than SFT (issue 15): during the cover's scoring, and in the
nightly flow between the compress commit and the catalog append. Each killed run is followed by a
rerun whose results equal a clean run's in another store."""

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

from race_core.config import CoverConfig, Resources
from race_core.envs.expert import expert_dataset
from race_core.policy import checkpoint_digest
from storage import ArtifactStore, Catalog, read_dataset_from_store
from tasks import stages


def _env(tmp_path: Path, api: str) -> dict[str, str]:
    env = {**os.environ, "PREFECT_HOME": str(tmp_path / "prefect"), "RACE_CHECKPOINT_CACHE": str(tmp_path / "c"),
           "HF_HUB_OFFLINE": "1", "PREFECT_SERVER_ANALYTICS_ENABLED": "false",
           "PREFECT_API_URL": api}  # the session's server, which outlives the killed run as a user's would
    env.pop("RACE_ALLOWED_ROOTS", None)
    return env


def _popen(args: list[str], env: dict[str, str]) -> subprocess.Popen:
    """A child in its own process group, so one killpg takes all it started down with it."""
    return subprocess.Popen(args, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            start_new_session=True)


def _kill_at(proc: subprocess.Popen, marker: str, timeout: float = 240) -> list[str]:
    seen: list[str] = []
    deadline = time.monotonic() + timeout
    try:
        for line in proc.stdout:
            seen.append(line)
            if marker in line:
                os.killpg(proc.pid, signal.SIGKILL)
                break
            assert time.monotonic() < deadline, "".join(seen[-30:])
        else:
            raise AssertionError(f"ended before {marker!r}:\n" + "".join(seen[-30:]))
        proc.wait(30)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(30)
    assert proc.returncode == -signal.SIGKILL, "".join(seen[-30:])
    return seen


def _summary(stdout: str) -> dict:
    return json.loads(stdout[stdout.index("{\n"):])


def test_killed_during_scoring_reruns_to_the_clean_result(tiny_checkpoint, demo_inputs, tmp_path, prefect_api):
    env = _env(tmp_path, prefect_api)
    common = ["--input", *demo_inputs, "--checkpoint", str(tiny_checkpoint),
              "--stages", "ingest", "validate", "cover", "compress", "--shard-size", "4"]
    race = [sys.executable, "-m", "flows.cli", "run", *common]
    store = tmp_path / "store"

    seen = _kill_at(_popen([*race, "--store", str(store)], env), "cover: trajectories")
    assert "round" in seen[-1], seen[-1]
    assert not (store / "stages" / "cover").exists() or not list((store / "stages" / "cover").glob("*.json"))

    resumed = subprocess.run([*race, "--store", str(store)], env=env, capture_output=True, text=True, timeout=300)
    assert resumed.returncode == 0, resumed.stdout[-3000:] + resumed.stderr[-3000:]
    summary = _summary(resumed.stdout)
    assert summary["stages"]["ingest"]["cached"] is True
    assert summary["stages"]["cover"]["cached"] is False and summary["stages"]["compress"]["cached"] is False

    clean = subprocess.run([*race, "--store", str(tmp_path / "clean")], env=env, capture_output=True, text=True,
                           timeout=300)
    assert clean.returncode == 0, clean.stdout[-3000:] + clean.stderr[-3000:]
    clean_summary = _summary(clean.stdout)
    assert {"decisions", "compressed", "rejects"} <= set(summary["objects"]), summary["objects"]
    assert summary["objects"] == clean_summary["objects"]


# The nightly flow in a child process. With RACE_TEST_HOLD_APPEND set, the catalog append first
# prints a marker and waits (a test hook in the child only, like a monkeypatch): the kill then lands
# deterministically after compress has committed and before the append.
NIGHTLY = textwrap.dedent("""
    import json, os, sys, time
    from flows.nightly import race_nightly
    from race_core.config import NightlyConfig
    from tasks import stages

    if os.environ.get("RACE_TEST_HOLD_APPEND"):
        def held(*args, **kwargs):
            print("TEST: catalog append reached", flush=True)
            time.sleep(600)
        stages.record_part = held
    inbox, checkpoint, runs = sys.argv[1], sys.argv[2], sys.argv[3:]
    out = [race_nightly(NightlyConfig(inbox=inbox, checkpoint=checkpoint, store=s)) for s in runs]
    print("SUMMARIES " + json.dumps(out), flush=True)
""")


def _catalog(store: Path, scope) -> list[dict]:
    return Catalog(ArtifactStore(str(store))).parts(scope)


def test_nightly_killed_between_compress_and_append_reruns_to_the_clean_catalog(tiny_checkpoint, tmp_path,
                                                                               prefect_api):
    env = _env(tmp_path, prefect_api)
    inbox = tmp_path / "inbox"
    inbox.mkdir()
    trajectories = expert_dataset(6, seed=21)
    for k in range(2):
        (inbox / f"part{k}.jsonl").write_text("".join(json.dumps(t.to_dict()) + "\n"
                                                      for t in trajectories[3 * k: 3 * k + 3]))
    glob = str(inbox / "*.jsonl")
    store, clean = tmp_path / "store", tmp_path / "clean"
    nightly = [sys.executable, "-c", NIGHTLY, glob, str(tiny_checkpoint)]
    scope = stages.catalog_scope(checkpoint_digest(tiny_checkpoint), CoverConfig(), Resources())

    proc = _popen([*nightly, str(store)], {**env, "RACE_TEST_HOLD_APPEND": "1"})
    _kill_at(proc, "TEST: catalog append reached")
    assert list((store / "stages" / "compress").glob("*.json")), "compress had not committed"
    assert _catalog(store, scope) == []
    assert not (store / "catalog").exists() or not any(p.is_file() for p in (store / "catalog").rglob("*"))

    # the rerun, then a third run on the same store; then a clean run in another store
    done = subprocess.run([*nightly, str(store), str(store), str(clean)], env=env, capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    resumed, third, clean_run = json.loads(done.stdout[done.stdout.index("SUMMARIES ") + 10:].splitlines()[0])

    assert resumed["new"] == 6 and resumed["already_compressed"] == 0
    assert resumed["part"] == clean_run["part"]
    assert third["new"] == 0 and third["already_compressed"] == 6 and third["part"] is None

    parts, clean_parts = _catalog(store, scope), _catalog(clean, scope)
    assert len(parts) == 1 and len(clean_parts) == 1
    assert parts[0]["part"] == clean_parts[0]["part"] == resumed["part"]
    assert sorted(parts[0]["ids"]) == sorted(clean_parts[0]["ids"]) == sorted(t.id for t in trajectories)
    part = read_dataset_from_store(ArtifactStore(str(store)), parts[0]["part"], "compressed")
    assert sorted(part["id"]) == sorted(t.id for t in trajectories)
