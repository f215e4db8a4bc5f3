"""scripts/fault_campaign.py at the size CI affords, on a local store and on S3 (moto's server on
127.0.0.1): `race cover` killed once at a random moment beside `race gc --delete --grace-hours 0`, then a final run
that must equal a clean one. About 1.5 to 3 minutes each on two loaded cores."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from components import require_s3

SCRIPT = Path(__file__).resolve().parents[1] / "scripts" / "fault_campaign.py"


@pytest.mark.slow
@pytest.mark.parametrize("store", ["local", "s3"])
def test_the_fault_campaign_finds_no_mismatch(store, tmp_path):
    if store == "s3":
        require_s3()
    kills = 1
    done = subprocess.run([sys.executable, str(SCRIPT), "--kills", str(kills), "--command", "cover", "--trajectories", "8",
                           "--store", store, "--seed", "1", "--work", str(tmp_path / "work")],
                          capture_output=True, text=True, timeout=1500)
    report = done.stdout
    assert done.returncode == 0, report[-4000:] + done.stderr[-3000:]
    assert "mismatches: 0" in report and f"runs started: {kills + 2}" in report
    assert "objects verified: 0" not in report  # the final store was checked, object by object
