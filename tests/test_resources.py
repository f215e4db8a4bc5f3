"""Every stage that loads a model loads it on the device and in the dtype it is given (issue 13:
a CUDA run must not train on the CPU because one stage used the default)."""

import pytest
import torch

from race_core import policy
from race_core.config import CoverConfig, EvalConfig, IngestConfig, Resources, RLConfig, SFTConfig
from storage import ArtifactStore
from tasks import stages, training_stages
from tasks.rl_run import rl_run
from tasks.training_stages import PolicyRef


@pytest.fixture
def loads(monkeypatch):
    """A spy on the real loader (it still loads): what each call asked for and what it got."""
    calls = []
    real = policy.load_policy

    def spy(checkpoint, device="cpu", dtype="float32"):
        model, tokenizer = real(checkpoint, device=device, dtype=dtype)
        parameter = next(model.parameters())
        calls.append({"device": device, "dtype": dtype, "got_dtype": parameter.dtype,
                      "got_device": parameter.device.type})
        return model, tokenizer

    monkeypatch.setattr(policy, "load_policy", spy)
    return calls


def test_every_model_stage_loads_with_the_requested_device_and_dtype(smoke_policy, demo_inputs, tmp_path, loads,
                                                                     monkeypatch):
    monkeypatch.setenv("RACE_CHECKPOINT_CACHE", str(tmp_path / "cache"))
    store = ArtifactStore(str(tmp_path / "store"))
    resources = Resources(device="cpu", dtype="bf16")  # a non-default dtype: any stage left on float32 shows
    base = PolicyRef.local(smoke_policy)
    seen = {}

    def run(stage, fn, *args):
        before = len(loads)
        manifest = fn(*args)
        seen[stage] = loads[before:]
        return manifest

    ingested = stages.ingest(store, demo_inputs, IngestConfig())
    trajectories = ingested["objects"]["trajectories"]
    decided = run("cover", stages.cover, store, trajectories, str(smoke_policy), base.digest, CoverConfig(),
                  resources)
    compressed = stages.compress(store, trajectories, decided["objects"]["decisions"], str(smoke_policy),
                                 base.digest, CoverConfig().epsilon)
    tuned = run("sft", training_stages.sft, store, compressed["objects"]["compressed"], base,
                SFTConfig(steps=1, batch_size=2), resources)
    rl_config = RLConfig(tasks_per_iteration=1, group_size=2, max_turns=2, max_new_tokens=24)
    run("sample", training_stages.sample, store, PolicyRef.of(tuned), rl_config, resources, 0)
    run("rl", rl_run, store, PolicyRef.of(tuned), rl_config, 1e-3, EvalConfig(), resources)
    run("evaluate", training_stages.evaluate, store, PolicyRef.of(tuned), EvalConfig(tasks=1, max_new_tokens=24),
        resources, "after_sft")
    assert set(seen) == {"cover", "sft", "sample", "rl", "evaluate"}
    for stage, calls in seen.items():
        assert calls, f"stage {stage} loaded no model"
        for call in calls:
            assert (call["device"], call["dtype"]) == ("cpu", "bfloat16"), (stage, call)
            assert (call["got_device"], call["got_dtype"]) == ("cpu", torch.bfloat16), (stage, call)
