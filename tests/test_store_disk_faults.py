"""The faults a disk under a local store produces, injected for real (tests/faults.py): a small tmpfs
filled up in the middle of a stage, the store's filesystem remounted read-only, a store folder its
user may not write (the run drops to the unprivileged user `nobody`). Each must end in one line
naming the path and the cause, a non-zero exit, nothing committed half, and a rerun (the cause
gone) equal to a clean run in a store of its own.

Needs root (mount, setpriv) as CI has; elsewhere these tests skip with the reason (CI=true fails).
About 3 minutes on two loaded cores.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import signal
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest
from components import missing
from faults import (
    NOBODY,
    assert_one_line_error,
    assert_store_consistent,
    child_env,
    fill,
    race_command,
    remount,
    tmpfs,
    tree_state,
)

from flows.cli import main

EPSILON, OTHER_EPSILON = "0.002", "0.01"
ENOSPC = "No space left on device (ENOSPC)"


@pytest.fixture(scope="module")
def world(tmp_path_factory, tiny_checkpoint):
    """A folder every user may read (pytest's own is 0700): the checkpoint and the inputs, copied."""
    from flows.cover import demo_inputs

    root = Path(tempfile.mkdtemp(prefix="race-faults-"))
    root.chmod(0o755)
    checkpoint = shutil.copytree(tiny_checkpoint, root / "checkpoint")
    inputs = demo_inputs(root / "home", n=8, seed=11)
    for path in root.rglob("*"):
        path.chmod(0o755 if path.is_dir() else 0o644)
    yield root, checkpoint, inputs
    shutil.rmtree(root, ignore_errors=True)


def cover_args(world, store: Path, out: Path, epsilon: str) -> list[str]:
    _, checkpoint, inputs = world
    return ["cover", "--input", *inputs, "--checkpoint", str(checkpoint), "--out", str(out), "--store", str(store),
            "--epsilon", epsilon]


@pytest.fixture(scope="module")
def clean(world, tmp_path_factory):
    """`race cover` at both ε into a store on an ordinary disk: the results every rerun must equal."""
    import contextlib
    import io

    root = tmp_path_factory.mktemp("clean")
    results = {}
    for epsilon in (EPSILON, OTHER_EPSILON):
        stdout = io.StringIO()
        with contextlib.redirect_stdout(stdout), contextlib.redirect_stderr(io.StringIO()):
            assert main(cover_args(world, root / "store", root / epsilon, epsilon)) == 0
        results[epsilon] = (json.loads(stdout.getvalue()), root / epsilon)
    return results


def assert_equals_clean(summary: dict, out: Path, clean_result) -> None:
    clean_summary, clean_out = clean_result
    assert summary["objects"] == clean_summary["objects"]
    for name in ("decisions", "compressed", "rejects"):
        assert (out / f"{name}.parquet").read_bytes() == (clean_out / f"{name}.parquet").read_bytes(), name


def run_filled_at(command: list[str], marker: str, disk: Path, env: dict, log: Path) -> tuple[int, str]:
    """Start `command`; when a line of its stderr holds `marker`, stop it, fill `disk`, let it go on."""
    with open(log, "w") as stdout:
        proc = subprocess.Popen(command, stdout=stdout, stderr=subprocess.PIPE, text=True, env=env,
                                start_new_session=True)
        seen = []
        try:
            for line in proc.stderr:
                seen.append(line)
                if marker in line:
                    proc.send_signal(signal.SIGSTOP)  # mid-stage: the stage has started, nothing of it written
                    fill(disk / "ballast")
                    proc.send_signal(signal.SIGCONT)
                    break
            else:
                raise AssertionError(f"never reached {marker!r}:\n" + "".join(seen[-40:]))
            seen.append(proc.stderr.read())
            proc.wait(600)
        finally:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
    return proc.returncode, "".join(seen)


# -- a full disk -------------------------------------------------------------------------------
def test_a_disk_that_fills_up_during_the_cover_fails_in_one_line_and_the_rerun_equals_a_clean_run(
        world, clean, tmp_path):
    env = child_env(tmp_path / "home")
    with tmpfs(tmp_path / "disk", "16m") as disk:
        store = disk / "store"
        rc, stderr = run_filled_at(race_command(*cover_args(world, store, tmp_path / "out", EPSILON)),
                                   "shard(s) of up to", disk, env, tmp_path / "fault.out")
        assert rc == 2, stderr[-4000:]
        assert_one_line_error(stderr, "cover", f"cannot write {store}/", ENOSPC, "free space")
        assert {stage for stage, _ in assert_store_consistent(store)} == {"ingest"}  # the cover did not commit

        (disk / "ballast").unlink()
        rerun = subprocess.run(race_command(*cover_args(world, store, tmp_path / "out", EPSILON)), env=env,
                               capture_output=True, text=True, timeout=600)
        assert rerun.returncode == 0, rerun.stderr[-4000:]
        summary = json.loads(rerun.stdout)
        assert {k: v["cached"] for k, v in summary["stages"].items()} == {
            "ingest": True, "cover": False, "compress": False}
        assert_equals_clean(summary, tmp_path / "out", clean[EPSILON])
        assert_store_consistent(store)


class FillAt(logging.Handler):
    """Fills the disk the moment a log line holding `marker` is emitted (in the logging thread, so
    the stage waits for it): mid-stage, deterministically. Keeps every record it sees."""

    def __init__(self, marker: str, disk: Path):
        super().__init__()
        self.marker, self.disk, self.filled, self.records = marker, disk, 0, []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)
        if not self.filled and self.marker in record.getMessage():
            self.filled = fill(self.disk / "ballast")


def test_race_run_on_a_disk_that_fills_up_during_sft_says_so_in_one_line_without_retrying(
        world, prefect_harness, tmp_path, capsys, monkeypatch):
    """Through Prefect: the task's failure is the store's one line (Prefect logs no traceback of
    it), a full disk is not retried (it fails the same way seconds later), the stages before it stay
    committed."""
    _, checkpoint, inputs = world
    monkeypatch.setenv("RACE_CHECKPOINT_CACHE", str(tmp_path / "checkpoints"))
    # SFT's step lines are its module's (under `tasks`); a task's and the flow's end, Prefect's own
    runs = [logging.getLogger(name) for name in ("tasks", "prefect.task_runs", "prefect.flow_runs")]
    with tmpfs(tmp_path / "disk", "16m") as disk:
        store = disk / "store"
        filler = FillAt("sft: step 1/", disk)
        for logger in runs:
            logger.addHandler(filler)
        try:
            rc = main(["run", "--input", *inputs, "--checkpoint", str(checkpoint), "--store", str(store),
                       "--stages", "ingest", "validate", "cover", "compress", "sft", "--sft-steps", "4",
                       "--epsilon", EPSILON])
        finally:
            for logger in runs:
                logger.removeHandler(filler)
        stderr = capsys.readouterr().err
        assert filler.filled > 0 and rc == 2, stderr[-4000:]
        assert_one_line_error(stderr, "run", f"cannot write {store}/", ENOSPC)
        messages = [r.getMessage() for r in filler.records]
        assert sum("sft: step 1/" in m for m in messages) == 1  # not retried
        failed = [r for r in filler.records if "StoreIOError" in r.getMessage()]
        assert failed and all(r.exc_info is None and r.exc_text is None for r in failed)  # no traceback
        assert any("Finished in state Failed" in m and "ENOSPC" in m for m in messages)
        committed = {stage for stage, _ in assert_store_consistent(store)}
        assert committed == {"ingest", "cover-shard", "cover", "compress"}  # everything but sft


# -- a read-only store -------------------------------------------------------------------------
def test_a_read_only_store_serves_what_it_holds_and_refuses_new_work_in_one_line(world, clean, tmp_path, capsys):
    with tmpfs(tmp_path / "disk", "16m") as disk:
        store = disk / "store"
        assert main(cover_args(world, store, tmp_path / "first", EPSILON)) == 0
        remount(disk, "ro")
        try:
            before = tree_state(store)
            capsys.readouterr()
            assert main(cover_args(world, store, tmp_path / "cached", EPSILON)) == 0  # reads only
            summary = json.loads(capsys.readouterr().out)
            assert all(stage["cached"] for stage in summary["stages"].values())
            assert_equals_clean(summary, tmp_path / "cached", clean[EPSILON])

            assert main(cover_args(world, store, tmp_path / "refused", OTHER_EPSILON)) == 2  # the cover must write
            assert_one_line_error(capsys.readouterr().err, "cover", f"cannot write {store}/",
                                  "Read-only file system (EROFS)", "remount it read-write")
            assert tree_state(store) == before  # nothing written, nothing touched
        finally:
            remount(disk, "rw")
        assert main(cover_args(world, store, tmp_path / "rerun", OTHER_EPSILON)) == 0
        summary = json.loads(capsys.readouterr().out)
        assert summary["stages"]["ingest"]["cached"] and not summary["stages"]["cover"]["cached"]
        assert_equals_clean(summary, tmp_path / "rerun", clean[OTHER_EPSILON])
        assert_store_consistent(store)


# -- a folder its user may not write -----------------------------------------------------------
def as_unprivileged(world) -> int | None:
    """The user to run as: `nobody` when the tests run as root (None: this user, who is not root)."""
    if os.geteuid() != 0:
        return None
    if shutil.which("setpriv") is None:
        missing("setpriv (util-linux)", "needed to drop from root to nobody")
    probe = subprocess.run(["setpriv", f"--reuid={NOBODY}", f"--regid={NOBODY}", "--clear-groups",
                            sys.executable, "-c", "import flows.cli"],
                           capture_output=True, text=True, cwd=world[0], env=child_env(world[0]))
    if probe.returncode != 0:
        missing("a project nobody can run", probe.stderr.strip()[-300:])
    return NOBODY


def test_a_store_folder_without_write_permission_serves_what_it_holds_and_refuses_new_work(
        world, clean, capsys):
    user = as_unprivileged(world)
    root = Path(tempfile.mkdtemp(prefix="race-perm-", dir=world[0]))
    root.chmod(0o755)
    store = root / "store"
    try:
        assert main(cover_args(world, store, root / "first", EPSILON)) == 0  # written by its owner
        home = root / "home"
        home.mkdir()
        if user is not None:
            os.chown(home, user, user)
        else:  # not root: the permission bits bind this user too
            for path in [store, *store.rglob("*")]:
                if path.is_dir():
                    path.chmod(0o555)
        env = child_env(home)
        before = tree_state(store)

        cached = subprocess.run(race_command(*cover_args(world, store, home / "cached", EPSILON), user=user), env=env,
                                capture_output=True, text=True, timeout=600, cwd=home)
        assert cached.returncode == 0, cached.stderr[-4000:]
        summary = json.loads(cached.stdout)
        assert all(stage["cached"] for stage in summary["stages"].values())
        assert_equals_clean(summary, home / "cached", clean[EPSILON])

        refused = subprocess.run(race_command(*cover_args(world, store, home / "refused", OTHER_EPSILON), user=user),
                                 env=env, capture_output=True, text=True, timeout=600, cwd=home)
        assert refused.returncode == 2, refused.stderr[-4000:]
        assert_one_line_error(refused.stderr, "cover", f"cannot write {store}/", "Permission denied (EACCES)",
                              "fix its permissions")
        assert tree_state(store) == before
    finally:
        for path in [store, *store.rglob("*")]:
            if path.is_dir():
                path.chmod(0o755)

    capsys.readouterr()
    assert main(cover_args(world, store, root / "rerun", OTHER_EPSILON)) == 0  # its owner, the cause gone
    assert_equals_clean(json.loads(capsys.readouterr().out), root / "rerun", clean[OTHER_EPSILON])
    assert_store_consistent(store)
