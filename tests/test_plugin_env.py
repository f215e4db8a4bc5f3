"""Environments from outside the package (race_core.envs): `--env module:attribute` and the entry point
group `race.environments`, with the guess-the-number game of tests/plugin_env.py (a module of this
folder, not of race_core). Resolution and its errors, the config and the CLI taking it, the stage
keys covering its source, the pipeline's stages playing it with a real (tiny) policy, and `race ablate`
end to end."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest
from plugin_env import GUESS

import race_core.envs as envs
from race_core.config import EvalConfig, Resources, RLConfig
from race_core.config import PipelineConfig as Config
from race_core.cover import logic_cover
from race_core.envs import environment_code, environment_key, environment_named, get_environment
from race_core.envs.base import heldout_seed
from race_core.rollout import rollouts_from_json
from storage import ArtifactStore
from tasks import training_stages
from tasks.fingerprints import stage_code
from tasks.policy_ref import PolicyRef

REF = "plugin_env:GUESS"
HERE = Path(__file__).resolve().parent


def test_a_reference_loads_the_users_environment_and_a_bad_one_says_why():
    assert get_environment(REF) is GUESS and environment_key(GUESS) == REF
    assert environment_named("guess-number-v1") is GUESS  # trajectories find it by their `environment` field
    with pytest.raises(ValueError, match=r"unknown environment 'guess': expected one of \['calculator', 'lookup'.*"
                                         r"module:attribute"):
        get_environment("guess")
    with pytest.raises(ValueError, match="cannot load 'plugin_env:NOPE': AttributeError"):
        get_environment("plugin_env:NOPE")
    with pytest.raises(ValueError, match="cannot load 'no_such_module_here:ENV': ModuleNotFoundError"):
        get_environment("no_such_module_here:ENV")
    with pytest.raises(ValueError, match="'plugin_env:GuessGame' is a type, not an instance of"):
        get_environment("plugin_env:GuessGame")


@pytest.fixture
def installed(tmp_path, monkeypatch, caplog):
    """A distribution installed on the path (a real dist-info, read by importlib.metadata) declaring the
    guess game under the entry point group, and one that tries to take race's own name `lookup`."""
    dist = tmp_path / "race_guess_plugin-0.3.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: race-guess-plugin\nVersion: 0.3\n")
    (dist / "entry_points.txt").write_text(f"[race.environments]\nguess = {REF}\nlookup = {REF}\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    for cached in (envs.installed_environments, envs.get_environment):
        cached.cache_clear()
    yield
    monkeypatch.undo()
    for cached in (envs.installed_environments, envs.get_environment):
        cached.cache_clear()


def test_an_installed_entry_point_is_an_environment_by_name_and_cannot_take_races_own(installed, caplog):
    assert envs.environment_names() == ("calculator", "lookup", "guess", "scienceworld", "textworld-cooking")
    assert get_environment("guess") is GUESS
    assert get_environment("lookup").name == "lookup"  # race's own keeps its name
    assert "environment 'lookup' of 'plugin_env:GUESS' (entry point race.environments) is ignored" in caplog.text


def test_the_config_takes_a_plugin_and_names_the_bad_field(tiny_checkpoint):
    def PipelineConfig(**parts):  # noqa: N802 - the config of a runnable run
        return Config(checkpoint=str(tiny_checkpoint), **parts)

    config = PipelineConfig(inputs=("x.jsonl",), rl=RLConfig(env=REF, difficulty=2), evaluate=EvalConfig(env=REF))
    assert config.check() is config
    with pytest.raises(ValueError, match="parameter 'rl.env': unknown environment 'guesss'"):
        PipelineConfig(inputs=("x.jsonl",), rl=RLConfig(env="guesss")).check()
    with pytest.raises(ValueError, match=r"parameter 'rl': environment 'guess': difficulty must be None or "
                                         r"one of \(2, 3, 4\), got 7"):
        PipelineConfig(inputs=("x.jsonl",), rl=RLConfig(env=REF, difficulty=7)).check()
    with pytest.raises(ValueError, match=r"parameter 'evaluate': environment 'guess': shape must be one of"):
        PipelineConfig(inputs=("x.jsonl",), evaluate=EvalConfig(env=REF, shape="two-part")).check()


def test_stage_keys_cover_a_plugins_source_and_not_races_own():
    code = stage_code("sample", {"env": REF, "sampler": "hf"})
    assert code["environment"] == {"source": hashlib.sha256((HERE / "plugin_env.py").read_bytes()).hexdigest(),
                                   "package": None}  # a module on the path, no distribution
    assert "environment" not in stage_code("sample", {"env": "lookup", "sampler": "hf"})
    assert environment_code("calculator") is None


def test_the_expert_wins_every_split_and_the_cover_runs_on_its_episodes(tiny_checkpoint):
    from race_core.scoring import make_scorer

    for seed in (0, heldout_seed(0)):
        tasks = GUESS.generate_tasks(20, seed)
        assert len({t.question for t in tasks}) == 20
    train, held_out = ({t.question for t in GUESS.generate_tasks(40, s)} for s in (0, heldout_seed(0)))
    assert not train & held_out
    experts = GUESS.expert_dataset(12, seed=1, reasoning_kinds=True)
    assert len(experts) == 12 and all(t.environment == "guess-number-v1" for t in experts)  # every game won
    assert all(GUESS.reasoning_kind(turn.reasoning) == kind for t in experts
               for turn, kind in zip(t.turns, t.extra["reasoning_kinds"], strict=True))
    scorer = make_scorer("hf", str(tiny_checkpoint))
    results = logic_cover(experts, scorer, 0.05)
    assert sum(len(r.audit) for r in results) > 0 and all(r.trajectory.turns for r in results)


def test_the_stages_play_a_plugin_with_a_real_policy(smoke_policy, tmp_path):
    store = ArtifactStore(tmp_path / "store")
    policy = PolicyRef.local(smoke_policy)
    rl = RLConfig(env=REF, difficulty=2, tasks_per_iteration=2, group_size=2, max_turns=3, max_new_tokens=24)
    sampled = training_stages.sample(store, policy, rl, Resources(), 0)
    rollouts = rollouts_from_json(store.get_bytes(sampled["objects"]["rollouts"]).decode())
    assert len(rollouts) == 4 and {r.environment for r in rollouts} == {"guess-number-v1"}
    assert all(1 <= len(r.turns) <= 3 for r in rollouts)
    evaluated = training_stages.evaluate(store, policy, EvalConfig(env=REF, tasks=3, max_turns=3, max_new_tokens=24),
                                         Resources())
    assert not evaluated["cached"] and evaluated["metrics"]["episodes"] == 3
    again = training_stages.evaluate(store, policy, EvalConfig(env=REF, tasks=3, max_turns=3, max_new_tokens=24),
                                     Resources())
    assert again["cached"] and again["key"] == evaluated["key"]


def test_env_check_passes_a_good_plugin_and_names_each_fault_of_a_broken_one(tiny_checkpoint, capsys):
    from flows.cli import main

    assert main(["env", "check", REF, "--tasks", "3", "--checkpoint", str(tiny_checkpoint)]) == 0
    out = capsys.readouterr().out
    facts = json.loads(out[out.index("{"):])
    assert facts["ok"] and facts["expert_won"] == "3/3" and facts["tasks"] == {"train": 3, "heldout": 3}
    assert facts["cover"]["candidates"] >= facts["cover"]["removed"] >= 0 and facts["cover"]["candidates"] > 0

    assert main(["env", "check", "plugin_env:BROKEN", "--tasks", "3"]) == 1
    lines = capsys.readouterr().out.splitlines()
    problems = [line.split(": ", 1)[1] for line in lines if line.startswith("race env check plugin_env:BROKEN: ")]
    assert any(p.startswith("no held-out split: 3 question(s) drawn for both") for p in problems)
    assert any("reasoning_kind reads 'current' from the text the expert labelled 'later'" in p for p in problems)
    assert any("replaying it raised ZeroDivisionError" in p for p in problems)
    assert main(["env", "check", "plugin_env:NOPE"]) == 1
    assert "cannot load 'plugin_env:NOPE'" in capsys.readouterr().out
    from race_core.envs.check import check_environment

    for own in ("calculator", "lookup"):  # race's own pass the check a plug-in gets
        found = check_environment(own, tasks=4)
        assert found.ok and found.facts["expert_won"] == "4/4", found.problems


def test_race_ablate_runs_a_plugin_end_to_end_at_minimal_size(prefect_harness, smoke_policy, tmp_path, installed,
                                                                capsys):
    """`race ablate --env plugin_env:GUESS`: inputs the plug-in's expert played, the cover, SFT, one RL run and the
    held-out evaluation, all in the guess game; the installed name `guess` is the same environment to the CLI, whose
    help lists it and which refuses a reference that does not load."""
    from flows.cli import main

    with pytest.raises(SystemExit) as shown:
        main(["ablate", "--help"])
    listed = " ".join(capsys.readouterr().out.split()).replace("- ", "-")  # argparse wraps at hyphens
    assert shown.value.code == 0 and "calculator, lookup, guess, scienceworld, textworld-cooking, or module:attribute" in listed
    with pytest.raises(SystemExit) as refused:
        main(["ablate", "--env", "plugin_env:NOPE"])
    assert refused.value.code == 2
    assert "argument --env: environment 'plugin_env:NOPE': cannot load" in capsys.readouterr().err
    from storage.parquet import read_dataset_from_store

    inputs = tmp_path / "guess.jsonl"
    inputs.write_text("".join(json.dumps(t.to_dict()) + "\n" for t in GUESS.expert_dataset(4, 1, reasoning_kinds=True)))
    home, out = tmp_path / "home", tmp_path / "out"
    args = ["ablate", "--home", str(home), "--out", str(out), "--checkpoint", str(smoke_policy), "--recipe", "none",
            "--input", str(inputs), "--seeds", "0", "--arms", "race", "--rl-seeds", "1", "--rl-arms", "race+rl",
            "--epsilon", "0.5", "--sft-steps", "1", "--sft-batch-size", "2", "--rl-iterations", "1",
            "--rl-tasks-per-iteration", "2", "--rl-group-size", "2", "--rl-max-turns", "3", "--rl-max-new-tokens", "16",
            "--rl-difficulty", "2", "--eval-tasks", "2", "--eval-max-turns", "3", "--eval-max-new-tokens", "16"]
    assert main([*args, "--env", REF]) == 0
    written = json.loads((out / "ablation.json").read_text())
    assert written["run"]["env"] == REF and written["run"]["difficulty"] == 2  # the run says what it played
    race = next(e for e in written["arms"] if e["arm"] == "race")
    assert [point["iteration"] for point in race["rl"]["curve"]] == [1]  # the RL run, evaluated after it
    assert set(written["rl_diagnostics"]) == {"race+rl seed 0"}
    assert written["training"]["race"]["candidates"] > 0  # the cover ran on the plug-in's trajectories
    played = read_dataset_from_store(ArtifactStore(str(home / "store")), race["rl"]["episodes_object"], "episodes")
    assert len(played) == 2 and set(played["environment"]) == {"guess-number-v1"}  # held-out guess games
    assert get_environment("guess") is get_environment(REF)  # the entry point's name: the same game
