"""The sample stage's unit of work (issue 16): chunks of an RL iteration's tasks, each with its own
seed, committed one by one; a chunk's rollouts do not depend on what else runs beside it, so a
pool's workers (tests/test_scale_out.py) and one process give the same rollouts, and a killed
stage resumes at the first chunk without a manifest. Real tiny policy, real store."""

import logging
from dataclasses import replace

import pytest

from race_core.config import RL_UPDATE_ONLY, PipelineConfig, Resources, RLConfig, key_fields
from race_core.policy import load_policy
from race_core.rollout import rollouts_from_json, rollouts_to_json, sample_chunks, sample_rollouts
from storage import ArtifactStore
from tasks import training_stages
from tasks.chunks import CHUNK_STAGE, chunk_record
from tasks.training_stages import PolicyRef, sample_scope

CONFIG = RLConfig(tasks_per_iteration=5, group_size=2, sample_chunk=2, max_new_tokens=48, max_turns=4)


def _rollouts(store: ArtifactStore, manifest: dict) -> list:
    return rollouts_from_json(store.get_bytes(manifest["objects"]["rollouts"]).decode("utf-8"))


def test_chunks_are_independent_and_a_killed_stage_resumes_at_the_first_missing_one(smoke_policy, tmp_path, caplog):
    caplog.set_level(logging.INFO, logger="tasks")
    store, policy = ArtifactStore(tmp_path / "store"), PolicyRef.local(smoke_policy)
    assert sample_chunks(CONFIG) == [(0, 2), (2, 4), (4, 5)]
    first = training_stages.sample(store, policy, CONFIG, Resources(), 1)
    rollouts = _rollouts(store, first)
    assert [r.group for r in rollouts] == [k for k in range(5) for _ in range(2)]  # GRPO groups stay global
    assert first["metrics"]["rollouts"] == 10
    scope = sample_scope(policy, CONFIG, Resources(), 1)
    assert sorted(store.list_records(f"stages/{CHUNK_STAGE}")) == sorted(f"{scope}-{c}.json" for c in range(3))

    model, tokenizer = load_policy(smoke_policy)  # chunk 1 alone, first, in another process's place
    assert rollouts_to_json(sample_rollouts(model, tokenizer, CONFIG, 1, chunk=1)) == rollouts_to_json(rollouts[4:8])

    # killed after chunk 0 was committed: no stage manifest, no manifests of chunks 1 and 2
    [key] = store.list_manifests("sample")
    store.fs.rm_file(store.manifest_path("sample", key))
    for chunk in (1, 2):
        store.fs.rm_file(f"{store.root}/{chunk_record(scope, chunk)}")
    caplog.clear()
    again = training_stages.sample(store, policy, CONFIG, Resources(), 1)
    lines = caplog.messages
    assert not again["cached"] and again["objects"]["rollouts"] == first["objects"]["rollouts"]
    assert any("3 chunk(s) of up to 2 task(s); 1 committed before" in line for line in lines), lines
    assert sum("committed" in line and line.startswith("sample: chunk") for line in lines) == 2


def test_chunk_size_is_keyed_only_when_set(smoke_policy):
    """Existing keys hold: rl.sample_chunk at its default (0: one draw of all K tasks) is left out."""
    assert "sample_chunk" not in key_fields(RLConfig()) and key_fields(CONFIG)["sample_chunk"] == 2
    policy = PolicyRef.local(smoke_policy)
    assert sample_scope(policy, RLConfig(), Resources(), 0) != sample_scope(policy, RLConfig(sample_chunk=4), Resources(), 0)
    with pytest.raises(ValueError, match="rl.sample_chunk"):
        PipelineConfig(inputs=("x.jsonl",), checkpoint="c", rl=RLConfig(sample_chunk=-1)).check()


def test_fields_only_the_update_reads_leave_the_sample_key_and_the_rollouts_alone(smoke_policy):
    """Issue 35: plain GRPO, cover-aware RL and GRPO with a length penalty play one policy at iteration 0,
    so they share its rollouts: the fields only the update reads are out of the sample stage's key, and
    sampling with every one of them changed plays the same rollouts (real tiny policy, one chunk)."""
    policy = PolicyRef.local(smoke_policy)
    changed = {"clip": 0.3, "closure_weight": 0.5, "lr": 3e-4, "weight_decay": 0.1, "epochs": 2, "mini_batch": 2,
               "mask_reasoning": False, "epsilon": 0.5, "skip_bonus": 0.05, "old_logprobs": "sampler", "eval_every": 2,
               "keep_every": 3, "max_grad_norm": 0.5, "cover_aware": False, "length_penalty": 0.01, "micro_batch": 2}
    assert set(changed) == RL_UPDATE_ONLY and all(getattr(CONFIG, k) != v for k, v in changed.items())
    other = replace(CONFIG, **changed)
    assert sample_scope(policy, other, Resources(), 0) == sample_scope(policy, CONFIG, Resources(), 0)
    assert sample_scope(policy, replace(CONFIG, temperature=0.7), Resources(), 0) != sample_scope(
        policy, CONFIG, Resources(), 0)  # what sampling reads stays keyed
    model, tokenizer = load_policy(smoke_policy)
    assert rollouts_to_json(sample_rollouts(model, tokenizer, other, 0, chunk=0)) == rollouts_to_json(
        sample_rollouts(model, tokenizer, CONFIG, 0, chunk=0))
