"""Helpers of the fault tests: real faults under the store (a small tmpfs filled up, a read-only
mount, a user without write permission) and what every fault must leave behind.

Mounting needs root (or CAP_SYS_ADMIN); without it the tests that mount are `components.missing`:
skipped on a developer's machine, failed under CI=true.
"""

from __future__ import annotations

import errno
import os
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from components import missing

from storage.store import TEMP_PREFIX, ArtifactStore

NOBODY = 65534  # the unprivileged user a root test drops to


@contextmanager
def tmpfs(path: Path, size: str, *options: str) -> Iterator[Path]:
    """A tmpfs of `size` (e.g. "8m") mounted at `path` for the block."""
    path.mkdir(parents=True, exist_ok=True)
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", ",".join([f"size={size}", "mode=0755", *options]),
                              "tmpfs", str(path)], capture_output=True, text=True)
    if mounted.returncode != 0:
        missing("a mountable tmpfs (root or CAP_SYS_ADMIN)", mounted.stderr.strip() or "mount failed")
    try:
        yield path
    finally:
        subprocess.run(["umount", "-l", str(path)], check=True)


def remount(path: Path, mode: str) -> None:
    """Remount the tmpfs at `path` read-only ("ro") or read-write ("rw")."""
    subprocess.run(["mount", "-o", f"remount,{mode}", str(path)], check=True)


def fill(ballast: Path) -> int:
    """Write `ballast` until its filesystem has no page left; returns the bytes written."""
    written = 0
    fd = os.open(ballast, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        for block in (1 << 20, 1 << 16, 1 << 12, 1 << 9):
            while True:
                try:
                    written += os.write(fd, b"\0" * block)
                except OSError as exc:
                    if exc.errno != errno.ENOSPC:
                        raise
                    break
    finally:
        os.close(fd)
    return written


def race_command(*args: str, user: int | None = None) -> list[str]:
    """The `race` command line as a child process (`python -m flows.cli`), as `user` if given."""
    command = [sys.executable, "-m", "flows.cli", *args]
    if user is not None:
        command = ["setpriv", f"--reuid={user}", f"--regid={user}", "--clear-groups", *command]
    return command


def child_env(home: Path) -> dict[str, str]:
    env = {**os.environ, "HOME": str(home), "PREFECT_HOME": str(home / "prefect"), "HF_HUB_OFFLINE": "1",
           "TOKENIZERS_PARALLELISM": "false", "PREFECT_SERVER_ANALYTICS_ENABLED": "false",
           "RACE_CHECKPOINT_CACHE": str(home / "checkpoints"), "PYTHONDONTWRITEBYTECODE": "1",
           "PYTHONPATH": str(Path(__file__).resolve().parents[1])}
    env.pop("PREFECT_API_URL", None)
    env.pop("RACE_ALLOWED_ROOTS", None)
    return env


def assert_one_line_error(stderr: str, command: str, where: str, *causes: str) -> str:
    """The run ended with `race <command>: error: ...` naming `where` and each cause, and no traceback."""
    assert "Traceback" not in stderr, stderr[-4000:]
    last = [line for line in stderr.splitlines() if line.strip()][-1]
    assert last.startswith(f"race {command}: error: "), stderr[-4000:]
    assert where in last, (where, last)
    for cause in causes:
        assert cause in last, (cause, last)
    return last


def assert_store_consistent(root: Path | str) -> set[tuple[str, str]]:
    """Every committed manifest's objects are there and hash to their names, and no write left a
    temp file: nothing is committed half. Returns the committed (stage, key) pairs."""
    store = ArtifactStore(str(root))
    committed = set()
    for stage in store.list_stages():
        for key in store.list_manifests(stage):
            manifest = store.read_manifest(stage, key)
            assert store.manifest_damage(manifest) is None, (stage, key)
            for digest in manifest.get("object_sizes", {}):
                assert store.verify_object(digest), (stage, key, digest)
            committed.add((stage, key))
    if store.local:
        litter = [str(p) for p in Path(store.root).rglob(f"{TEMP_PREFIX}*")]
        assert not litter, litter
    return committed


def tree_state(root: Path) -> dict[str, tuple[int, int]]:
    """Every file under `root`: (size, mtime in ns), to show that nothing changed."""
    return {str(p.relative_to(root)): (p.stat().st_size, p.stat().st_mtime_ns) for p in root.rglob("*")
            if p.is_file()}
