"""scripts/pip_retry.sh: an install the network fails is tried again; any other failure is not.

The pip here is a fake (a shell script that fails on purpose, then succeeds): the fault under test is
the registry dropping a download, which cannot be made to happen on demand with the real one.
"""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

DROPPED = (
    "WARNING: Connection interrupted while downloading.\n"
    "error: incomplete-download\n"
    "note: This is an issue with network connectivity, not pip.\n"
)
NO_SUCH = "ERROR: No matching distribution found for nosuchpkg\n"


def _run(tmp_path: Path, failures: list[str], attempts: int = 3) -> tuple[int, int, str]:
    """Call pip_quiet with a fake pip that prints `failures[i]` and exits 1 on call i, then succeeds.

    Returns (pip_quiet's status, calls the fake saw, stderr+stdout)."""
    fake = tmp_path / "fake_pip.sh"
    calls = tmp_path / "calls"
    for i, text in enumerate(failures):
        (tmp_path / f"fail{i}").write_text(text)
    fake.write_text(
        "#!/usr/bin/env bash\n"
        f'n=$(cat "{calls}" 2>/dev/null || echo 0); echo $((n + 1)) > "{calls}"\n'
        f'if [ -f "{tmp_path}/fail$n" ]; then cat "{tmp_path}/fail$n" >&2; exit 1; fi\n'
        "echo \"WARNING: Location 'file:///x/' is ignored: it is neither a file nor a directory.\"\n"
        'echo "installed $*"\n'
    )
    fake.chmod(0o755)
    script = (
        "set -euo pipefail\n"
        f'PIP=("{fake}")\n'
        "source scripts/pip_retry.sh\n"
        "pip_quiet install somepkg\n"
    )
    env = {"PATH": "/usr/bin:/bin", "RACE_PIP_ATTEMPTS": str(attempts), "RACE_PIP_PAUSE": "0"}
    done = subprocess.run(["bash", "-c", script], cwd=ROOT, env=env, capture_output=True, text=True)
    seen = int(calls.read_text()) if calls.exists() else 0
    return done.returncode, seen, done.stdout + done.stderr


def test_dropped_download_is_tried_again_and_succeeds(tmp_path):
    status, calls, out = _run(tmp_path, [DROPPED, DROPPED])
    assert status == 0, out
    assert calls == 3
    assert out.count("failed on the network (attempt") == 2
    assert "installed install somepkg" in out
    assert "is ignored" not in out  # the notices stay hidden


def test_network_failures_stop_after_the_attempts(tmp_path):
    status, calls, out = _run(tmp_path, [DROPPED] * 5, attempts=3)
    assert status == 1
    assert calls == 3
    assert "incomplete-download" in out  # pip's own words reach the log


@pytest.mark.parametrize("text", [NO_SUCH, "ERROR: ResolutionImpossible: fastapi\n"])
def test_other_failures_fail_at_once(tmp_path, text):
    status, calls, out = _run(tmp_path, [text])
    assert status == 1
    assert calls == 1
    assert "failed on the network" not in out
