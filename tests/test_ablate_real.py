"""`race ablate --checkpoint`: ε chosen from a sweep by the half-removal rule, presets picked by where the
run is, and the whole loop on a real instruct model (SmolLM2-135M-Instruct) at minimal size:
bootstrap -> its own episodes -> sweep -> arms -> SFT -> RL vs GRPO -> evaluation, every stage
stored, the RL diagnostics recorded, a rerun computing nothing."""

from __future__ import annotations

import json

import pytest

from flows.ablate import PRESETS, preset_for
from flows.sweep import choose_epsilon

EPS = (0.001, 0.003, 0.01, 0.03, 0.1, 0.3, 1.0)


def _rows(shares):
    return [{"epsilon": e, "removal_share": s} for e, s in zip(EPS, shares, strict=True)]


def test_the_sweep_takes_the_smallest_epsilon_removing_half_of_the_most_any_removes():
    # a real model's curve: no plateau, each larger ε removes a little more
    epsilon, why = choose_epsilon(_rows([0.01, 0.02, 0.05, 0.12, 0.25, 0.41, 0.6]))
    assert epsilon == 0.3 and "41.0%" in why and "60.0% at ε 1" in why
    # a plateau is no obstacle either: half of 0.62 is first reached at 0.03
    assert choose_epsilon(_rows([0.0, 0.0, 0.1, 0.5, 0.6, 0.62, 0.62]))[0] == 0.03
    # the order rows come in does not matter; nothing removed anywhere: the largest ε
    assert choose_epsilon(list(reversed(_rows([0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8]))))[0] == 0.01
    assert choose_epsilon(_rows([0.0] * 7)) == (1.0, "no ε of the sweep removed any reasoning")
    assert choose_epsilon([{"epsilon": 0.05, "removal_share": 0.3}]) == (0.05, "the only ε of the sweep")


def test_a_checkpoint_picks_the_cpu_or_gpu_preset_and_the_cpu_one_names_what_it_leaves_out():
    assert preset_for("", "cpu") == "tiny" and preset_for("", "cuda") == "tiny"
    assert preset_for("ckpt", "cpu") == "cpu" and preset_for("ckpt", "cuda:1") == "gpu"
    cpu, gpu = PRESETS["cpu"], PRESETS["gpu"]
    assert len(cpu.epsilons) > 1 and cpu.epsilons == gpu.epsilons and cpu.bootstrap and gpu.bootstrap
    assert cpu.left_out and not gpu.left_out and set(cpu.seeds) < set(gpu.seeds)
    assert cpu.config.evaluate.tasks < gpu.config.evaluate.tasks


@pytest.mark.slow
def test_the_whole_loop_runs_on_a_real_instruct_model_in_the_multi_turn_world(prefect_harness, smollm2_checkpoint,
                                                                             tmp_path):
    """SmolLM2-135M-Instruct at minimal size in the lookup world (episodes of 4-6 turns where a later
    calc reads a number an earlier turn noted): the numbers are not the point, the stages' outputs,
    the cross-turn figure and the RL diagnostics are, each checked against what the run stored. The
    inputs are the scripted expert's episodes in the policy's format (a few SFT steps do not teach
    a 135M model to win lookup episodes of its own), so the covers see the reasoning kinds of a
    real multi-turn agent. Every evaluation and every RL run plays on the process's one vLLM engine
    (`race_core.sampling.shared`), each policy's weights loaded into it in place."""
    from components import require_vllm

    from flows.ablate import race_ablate
    from race_core.ablation import candidate_turns
    from race_core.config import CoverConfig, EvalConfig, PipelineConfig, Resources, RLConfig, SFTConfig
    from race_core.envs import get_environment
    from race_core.envs.agent import AgentPrompt
    from race_core.policy import load_tokenizer
    from race_core.render import Renderer
    from race_core.rollout import rollouts_from_json
    from race_core.train.checkpoint_bootstrap import AgentBootstrapConfig
    from storage import ArtifactStore
    from tasks.ablation import removals

    lookup = get_environment("lookup")
    agent = AgentPrompt.for_renderer(Renderer(load_tokenizer(smollm2_checkpoint)), lookup)
    inputs = [agent.dress(t) for t in lookup.expert_dataset(4, seed=7, reasoning_kinds=True)]
    assert len(inputs) == 4 and all(len(t.turns) >= 4 for t in inputs)
    path = tmp_path / "inputs.jsonl"
    path.write_text("".join(json.dumps(t.to_dict()) + "\n" for t in inputs))
    turns, tokens, held_out = 6, 32, 2  # a turn played costs a decode step per token of its longest episode
    config = PipelineConfig(
        checkpoint=str(smollm2_checkpoint), inputs=(str(path),), cover=CoverConfig(epsilon=0.1),
        sft=SFTConfig(steps=1, batch_size=2, lr=5e-5, max_length=512),  # an episode is ~1,800 tokens: its start
        rl=RLConfig(env="lookup", shape="random", iterations=1, tasks_per_iteration=1, group_size=2, max_turns=turns,
                    max_new_tokens=tokens, lr=1e-5, sampler="vllm"),
        evaluate=EvalConfig(env="lookup", shape="random", tasks=held_out, max_turns=turns, max_new_tokens=tokens,
                            sampler="vllm"),
        resources=Resources(vllm_eager=True))
    require_vllm()
    from race_core.sampling.shared import release_shared, shared_engine_builds

    release_shared()
    builds = shared_engine_builds()
    bootstrap = AgentBootstrapConfig(env="lookup", shape="random", expert_tasks=24, check_tasks=1, check_samples=2,
                                     max_turns=turns, max_new_tokens=tokens,
                                     sft=SFTConfig(lr=3e-4, steps=2, batch_size=2, warmup_steps=1, max_length=512))
    home, out = tmp_path / "home", tmp_path / "out"
    run = dict(home=str(home), out=str(out), seeds=(0,), config=config, bootstrap=bootstrap, epsilons=(0.03, 0.3),
               arms=("race", "local"), length_penalties=(0.01,), preset="test",
               rl_arms=("race+rl", "race+grpo+lp0.01"))  # every arm's path: tests/test_ablation.py
    result = race_ablate(**run)

    boot = result["bootstrap"]
    assert boot["actions"] == "text" and boot["check"]["episodes"] == 2
    trained = boot["rounds"][0]
    assert trained["data"] == "expert" and trained["steps"] == 2 and trained["last_loss"] < trained["first_loss"]
    store = ArtifactStore(str(home / "store"))
    assert result["run"]["inputs"] == [str(path)]
    assert result["epsilon_choice"]["epsilon"] in (0.03, 0.3) and result["epsilon_choice"]["why"]
    assert [(e["arm"], e["seed"]) for e in result["arms"]] == [("race", 0), ("local", 0)]
    for entry in result["arms"]:
        assert entry["success_rate"] * held_out == round(entry["success_rate"] * held_out)  # per held-out episode
        assert entry["turns_per_episode"] <= turns

    # the cross-turn figure, recounted from the inputs and the two covers' stored removals
    cross = result["cross_turn"]["race"]
    assert cross["candidates"] == sum(len(candidate_turns(t)) for t in inputs) > 4
    assert cross["candidates"] >= cross["rejected"] >= cross["rejected_by_later"] >= 0
    race, local = (removals(store, result["compressed"][arm]) for arm in ("race", "local"))
    assert cross["candidates"] - cross["rejected"] == sum(map(len, race.values()))
    versus = result["cross_turn"]["local_vs_race"]
    assert versus["local_accepted"] == sum(map(len, local.values()))
    assert versus["race_rejected"] == sum(t not in race.get(i, ()) for i, ts in local.items() for t in ts)
    kinds = result["removed_by_kind"]["race"]
    assert sum(k["candidates"] for k in kinds.values()) == cross["candidates"]

    diagnostics = result["rl_diagnostics"]
    assert set(diagnostics) == {"race+rl seed 0", "race+grpo+lp0.01 seed 0"}
    # one SFT policy at iteration 0, and sampling does not read what tells the updates apart: one sampling
    assert len({metrics["rollouts_object"] for (metrics,) in diagnostics.values()}) == 1
    for name, (metrics,) in diagnostics.items():  # one iteration each, checked against its stored rollouts
        rollouts = rollouts_from_json(store.get_bytes(metrics["rollouts_object"]).decode())
        assert metrics["rollouts"] == len(rollouts) == 2  # one task, a group of two
        assert all(r.environment == lookup.environment for r in rollouts)
        assert metrics["policy_tokens"] == sum(sum(r.policy_mask) for r in rollouts) > 0
        assert metrics["total_turns"] == sum(len(r.turns) for r in rollouts)
        assert metrics["success_rate"] == sum(r.success for r in rollouts) / 2
        reasoning_of_successes = sum(r.reasoning_token_count() for r in rollouts if r.success)
        assert 0 <= metrics["masked_tokens"] <= reasoning_of_successes
        assert metrics["closure_terms"] <= sum(len(r.turns) - 1 for r in rollouts if r.success)
        assert metrics["actor_loss"] + config.rl.closure_weight * metrics["closure_loss"] == pytest.approx(metrics["loss"])
        assert (metrics["closure_loss"] > 0) == (metrics["closure_terms"] > 0)  # −Σ log p(close) / T_total
        if name.startswith("race+grpo"):
            assert metrics["masked_tokens"] == metrics["closure_terms"] == 0
        assert metrics["skip_ratio"] == sum(not t.reasoning.strip() for r in rollouts for t in r.turns) / max(
            metrics["total_turns"], 1)
    assert shared_engine_builds() == builds + 1  # one engine played every evaluation and every RL run
    race_entry = result["arms"][0]
    assert set(race_entry) >= {"rl", "grpo+lp0.01"}
    again = race_ablate(**run)
    assert again["computed"] == 0 and again["arms"] == result["arms"]
    assert (out / "report.md").read_text().count("RL diagnostics") == len(diagnostics) == 2  # one table per RL run
