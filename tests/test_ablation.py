"""The ablation (`race ablate`, issue 17): each arm's trajectories differ from the unchanged ones
exactly where the arm says, the kind of a reasoning text is read back from the text as the expert
labelled it, the local-only cover checks only the turn's own action, and the ablation flow (real
Prefect, real tiny model, real store) caches every arm: a rerun computes nothing."""

from __future__ import annotations

import json
from functools import partial

import pytest

from race_core.ablation import ARMS, candidate_turns, derived_removal, phases_of, removed_by_kind
from race_core.cover import logic_cover
from race_core.decisions import remove_reasoning
from race_core.envs.expert import REDUNDANT, expert_dataset, reasoning_kind


@pytest.fixture(scope="module")
def two_part():
    return expert_dataset(40, 21, reasoning_kinds=True, shape="two-part")


@pytest.mark.parametrize("shape", ["two-part", "random"])
def test_the_kind_read_from_the_text_is_the_kind_the_expert_recorded(shape):
    episodes = expert_dataset(120, 4, reasoning_kinds=True, shape=shape)
    labels = [(kind, turn.reasoning) for t in episodes for kind, turn in zip(t.extra["reasoning_kinds"], t.turns, strict=True)]
    assert len({kind for kind, _ in labels}) >= (4 if shape == "two-part" else 2)  # random trees: few mental pairs
    assert [reasoning_kind(text) for _, text in labels] == [kind for kind, _ in labels]


def test_each_arm_differs_from_the_unchanged_trajectories_exactly_where_it_should(two_part):
    race = {t.id: [k for k in candidate_turns(t) if reasoning_kind(t.turns[k].reasoning) == REDUNDANT][::2]
            for t in two_part}  # a stand-in for the race arm's removals: every other redundant turn
    assert sum(map(len, race.values())) >= 10
    words = lambda text: len(text.split())  # noqa: E731 - a token count for the test
    gaps = []
    for t in two_part:
        candidates = candidate_turns(t)
        assert derived_removal("none", t, race[t.id]) == []
        assert derived_removal("all", t, race[t.id]) == candidates and 0 not in candidates
        drawn = derived_removal("random", t, race[t.id], seed=3, tokens=words)
        assert set(drawn) <= set(candidates) and drawn == derived_removal("random", t, race[t.id], seed=3, tokens=words)
        # matched to the race arm's removed tokens: no other candidate would bring them closer
        target = sum(words(t.turns[k].reasoning) for k in race[t.id])
        got = sum(words(t.turns[k].reasoning) for k in drawn)
        assert all(abs(got + words(t.turns[k].reasoning) - target) >= abs(got - target)
                   for k in candidates if k not in drawn)
        gaps.append(abs(got - target) / max(target, 1))
        for arm_turns in (race[t.id], drawn, candidates):
            changed = remove_reasoning(t, arm_turns)
            assert [k for k, (a, b) in enumerate(zip(t.turns, changed.turns, strict=True)) if a != b] == \
                [k for k in arm_turns if t.turns[k].reasoning]
            assert all(not changed.turns[k].reasoning for k in arm_turns)
            assert [turn.action for turn in changed.turns] == [turn.action for turn in t.turns]
    assert sum(gaps) / len(gaps) < 0.5  # near the race arm's tokens, trajectory by trajectory
    draws = {s: [derived_removal("random", t, race[t.id], seed=s, tokens=words) for t in two_part] for s in (0, 1)}
    assert draws[0] != draws[1]  # the seed matters
    with pytest.raises(ValueError, match="not a derived arm"):
        derived_removal("race", two_part[0], [])
    with pytest.raises(ValueError, match="not all of them candidates"):
        derived_removal("random", two_part[0], [0])


def test_removed_by_kind_counts_candidates_and_removals_per_kind(two_part):
    every = {t.id: candidate_turns(t) for t in two_part}
    shares = removed_by_kind(two_part, every)
    assert set(shares) == {"later", "current", "redundant"}
    assert all(s["removed"] == s["candidates"] > 0 and s["share"] == 1.0 for s in shares.values())
    total = sum(len(v) for v in every.values())
    assert sum(s["candidates"] for s in shares.values()) == total
    assert all(s["removed"] == 0 for s in removed_by_kind(two_part, {}).values())


def test_the_local_only_cover_checks_only_the_turns_own_action(two_part):
    """A scorer under which removing turn 1's reasoning costs turn 2's action 1 nat and turn 1's own
    nothing: RACE keeps turn 1's reasoning, the local-only cover removes it."""
    trajectory = next(t for t in two_part if len(t.turns) >= 3 and t.turns[1].reasoning and t.turns[2].reasoning)

    def scorer(trajectories):
        return [[0.0, 0.0, 0.0 if t.turns[1].reasoning else -1.0, *[0.0] * (len(t.turns) - 3)] for t in trajectories]

    for early_reject in (False, True):
        race = logic_cover([trajectory], scorer, 1e-3, early_reject=early_reject)[0]
        local = logic_cover([trajectory], scorer, 1e-3, early_reject=early_reject, local_only=True)[0]
        assert 1 not in race.skipped_turns and 2 in race.skipped_turns
        assert 1 in local.skipped_turns and 2 in local.skipped_turns
        assert local.audit[0]["max_drop"] == pytest.approx(1.0)  # the later drop is still measured


def test_the_recorded_command_reruns_the_ablation():
    """ablation.json's command names what the preset does not: the home, the checkpoint, the preset, a given ε."""
    from flows.ablate import _command

    assert _command("h", "o", "ckpt", "cpu", (0.3,)) == "race ablate --home h --out o --checkpoint ckpt --preset cpu --epsilon 0.3"
    assert _command("h", "o", "", "", (0.003, 0.01)) == "race ablate --home h --out o"
    assert _command("h", "o", "ckpt", "cpu", (), ("--curve 0",)) == \
        "race ablate --home h --out o --checkpoint ckpt --preset cpu --curve 0"


def test_the_recorded_command_names_where_a_run_left_its_preset():
    """A run cut short (two seeds, no curve, no RL) records the options that rerun exactly it."""
    from flows.ablate import PRESETS, _overrides

    preset = PRESETS["cpu-lookup"]
    assert _overrides("cpu-lookup", preset.seeds, preset.curve, preset.config.rl.iterations) == ()
    assert _overrides("cpu-lookup", (0, 1), 0, 0) == ("--seeds 0 1", "--curve 0", "--rl-iterations 0")
    assert _overrides("cpu-lookup", preset.seeds, preset.curve, preset.config.rl.iterations, ("none", "race")) == (
        "--arms none race",)
    assert _overrides("cpu-lookup", preset.seeds, preset.curve, 3, None, ("race+rl", "none+grpo"), 1) == (
        "--rl-iterations 3", "--rl-arms race+rl none+grpo")  # rl_seeds 1 is the preset's
    assert _overrides("", (0, 1), 0, 0) == ()  # no preset: the flow's own defaults, nothing to name


def test_curve_on_the_command_line_overrides_the_presets():
    """`race ablate --curve 0` skips the trade-off curve a preset runs (a run cut short reports after RL)."""
    from flows.cli import build_parser

    parser = build_parser()
    assert parser.parse_args(["ablate", "--preset", "cpu-lookup", "--curve", "0"]).curve == 0
    assert parser.parse_args(["ablate", "--preset", "cpu-lookup"]).curve is None  # the preset's own


def test_the_curve_takes_the_sweeps_epsilons_nearest_the_chosen_one_on_each_side():
    from flows.ablate import curve_epsilons

    sweep = (0.003, 0.01, 0.03, 0.1, 0.3, 1.0)
    assert curve_epsilons(0.1, sweep, 1) == [0.03, 0.3]
    assert curve_epsilons(0.1, sweep, 2) == [0.01, 0.03, 0.3, 1.0]
    assert curve_epsilons(0.003, sweep, 1) == [0.01] and curve_epsilons(1.0, sweep, 1) == [0.3]  # at an end: one side
    assert curve_epsilons(0.05, sweep, 1) == [0.03, 0.1]  # a chosen ε the sweep did not run
    assert curve_epsilons(0.1, sweep, 0) == [] and curve_epsilons(0.1, (0.1,), 1) == []


def test_the_ablation_flow_caches_every_arm(prefect_harness, smoke_policy, tmp_path):
    from flows.ablate import race_ablate
    from race_core.config import CoverConfig, EvalConfig, PipelineConfig, RLConfig, SFTConfig
    from storage import ArtifactStore
    from storage.parquet import read_dataset_from_store
    from tasks.stages import iter_trajectories

    inputs = tmp_path / "kinds.jsonl"
    inputs.write_text("".join(json.dumps(t.to_dict()) + "\n" for t in expert_dataset(8, 2, reasoning_kinds=True,
                                                                                       shape="two-part")))
    config = PipelineConfig(
        inputs=(str(inputs),), checkpoint=str(smoke_policy), cover=CoverConfig(epsilon=0.5),
        sft=SFTConfig(steps=2, batch_size=4, lr=1e-4), evaluate=EvalConfig(tasks=3, shape="two-part", max_turns=4,
                                                                            max_new_tokens=24),
        rl=RLConfig(iterations=1, tasks_per_iteration=2, group_size=2, max_turns=4, max_new_tokens=24, shape="two-part"))
    home, out = tmp_path / "home", tmp_path / "out"
    run = {"home": str(home), "out": str(out), "seeds": (0, 1), "config": config, "length_penalties": (0.01,),
           "skip_bonuses": (0.05,), "rl_seeds": 1,
           "epsilons": (0.1, 0.5, 2.0), "curve": 1}
    first = race_ablate(**run)
    # seed by seed: every arm of seed 0 is trained before any of seed 1, so a run stopped part way holds
    # whole seeds (the tables still list arm, then seed)
    stored = ArtifactStore(str(home / "store"))
    arm_of = {digest: arm for arm, digest in first["compressed"].items()}
    trained = sorted((m["created_at"], arm_of[m["inputs"]["compressed"]], m["config"]["seed"])
                     for m in map(partial(stored.read_manifest, "sft"), stored.list_manifests("sft"))
                     if m["inputs"]["compressed"] in arm_of)  # the curve's other ε come last, on other data
    assert [(arm, seed) for _, arm, seed in trained] == [(a, s) for s in (0, 1) for a in ARMS]
    again = race_ablate(**run)
    assert first["computed"] > 0 and again["computed"] == 0
    assert again["arms"] == first["arms"] and again["removed_by_kind"] == first["removed_by_kind"]
    written = json.loads((out / "ablation.json").read_text())
    assert [(e["arm"], e["seed"]) for e in written["arms"]] == [(a, s) for a in ARMS for s in (0, 1)]
    episodes = config.evaluate.tasks  # greedy: one episode per task
    for entry in written["arms"]:  # means over the arm's episodes: whole counts of them
        successes, tokens = entry["success_rate"] * episodes, entry["reasoning_tokens_per_episode"] * episodes
        assert abs(successes - round(successes)) < 1e-9 and 0 <= round(successes) <= episodes
        assert abs(tokens - round(tokens)) < 1e-9
        rl_runs = {"race": ["rl", "grpo", "close", "grpo+lp0.01", "adapt0.05"], "none": ["grpo"]}
        assert phases_of(entry) == (rl_runs.get(entry["arm"], []) if entry["seed"] == 0 else [])  # rl_seeds 1
    # every RL run of the paper's table and the users' alternatives, from seed 0's SFT policies
    assert set(written["rl_diagnostics"]) == {f"{name} seed 0" for name in (
        "none+grpo", "race+rl", "race+grpo", "race+close", "race+grpo+lp0.01", "race+adapt0.05")}
    assert {"race+rl", "none+grpo", "race+close", "race+adapt0.05"} <= set(written["summary"])
    for name, summary in written["summary"].items():  # the paper's figures beside success, every arm
        assert {"skip_ratio", "reasoning_tokens_per_thinking_turn"} <= set(summary), name
    assert (out / "ablation-rl.png").stat().st_size > 0 and "ablation-rl.png" in (out / "report.md").read_text()
    # the page's explorer opens the method's held-out episodes (race+rl, seed 0, its last evaluation)
    page = (out / "report.html").read_text()
    race = next(e for e in written["arms"] if e["arm"] == "race" and e["seed"] == 0)
    stored_episodes = read_dataset_from_store(stored, race["rl"]["episodes_object"], "episodes")
    assert len(stored_episodes) == config.evaluate.tasks and 'id="race-data"' in page
    assert all(json.dumps(q)[1:-1] in page for q in stored_episodes["id"])
    assert (out / "ablation.png").stat().st_size > 0 and "| race |" in (out / "report.md").read_text()
    cross, gap = written["cross_turn"]["race"], written["cross_turn"]["local_vs_race"]
    assert 0 <= cross["rejected_by_later"] <= cross["rejected"] <= cross["candidates"] > 0
    assert gap["local_accepted"] == first["training"]["local"]["removed"] >= gap["race_rejected"] >= 0
    assert "## The cross-turn check" in (out / "report.md").read_text()
    assert written["run"]["command"] == f"race ablate --home {home} --out {out} --checkpoint {smoke_policy}"
    # the trade-off curve: RACE and local-only at the chosen ε (the main table's first seed) and its sweep neighbours
    eps = written["run"]["epsilon"]
    from flows.ablate import curve_epsilons

    expected = curve_epsilons(eps, (0.1, 0.5, 2.0), 1)
    assert 1 <= len(expected) <= 2 and eps not in expected
    assert [(p["arm"], p["epsilon"]) for p in written["curve"]] == [
        (arm, e) for arm in ("local", "race") for e in sorted([eps, *expected])]
    main = {(e["arm"], e["seed"]): e for e in written["arms"]}
    for point in written["curve"]:
        assert point["seed"] == 0 and 0 <= point["success_rate"] <= 1
        if point["epsilon"] == eps:  # the same policy as the table's
            assert point["policy_digest"] == main[(point["arm"], 0)]["policy_digest"]
    assert "## The trade-off curve" in (out / "report.md").read_text()

    store = ArtifactStore(str(home / "store"))
    arms = {arm: {t.id: t for t in iter_trajectories(store, digest, "compressed")}
            for arm, digest in first["compressed"].items()}
    training = first["training"]
    removed = {arm: training[arm]["reasoning_tokens_before"] - training[arm]["reasoning_tokens_after"]
               for arm in ("race", "random")}
    assert removed["race"] > 0 and abs(removed["random"] - removed["race"]) <= removed["race"] / 2  # matched tokens
    assert training["all"]["removed"] == sum(len(candidate_turns(t)) for t in arms["none"].values())
    assert training["none"]["removed"] == 0
    for tid, original in arms["none"].items():
        assert all(not t.reasoning for t in arms["all"][tid].turns[1:])
        assert arms["all"][tid].turns[0] == original.turns[0]
        for arm in ("race", "local", "random"):
            differs = [k for k, (a, b) in enumerate(zip(original.turns, arms[arm][tid].turns, strict=True)) if a != b]
            assert all(k in candidate_turns(original) and not arms[arm][tid].turns[k].reasoning for k in differs)
