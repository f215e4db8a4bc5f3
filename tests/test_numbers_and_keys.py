"""Numbers that must not decide silently (a NaN score, a noisy scorer) and stage keys that change
exactly when results can (code, libraries, environment) and only then (files that are not the model)."""

from __future__ import annotations

import math
import shutil
import tracemalloc
from pathlib import Path

import pytest

import tasks.fingerprints as fingerprints
import tasks.training_stages as training_stages
from race_core.config import CoverConfig, EvalConfig, Resources, RLConfig
from race_core.cover import NON_FINITE, ScorerNoiseError, as_scorer, check_noise, logic_cover
from race_core.decisions import CoverContext, decision_rows
from race_core.envs.calculator import ENV_REVISION
from race_core.policy import DIGEST_CHUNK, checkpoint_digest, load_tokenizer
from race_core.render import Renderer
from race_core.schema import Trajectory, Turn
from storage import ArtifactStore
from storage.parquet import read_dataset, write_dataset, write_dataset_to_store
from tasks import stages

EPS = 1e-3
REPO = Path(__file__).resolve().parents[1]


def make(reasonings=("a", "b", "c")) -> Trajectory:
    return Trajectory("q", "calc", "r1", [Turn(r, f"calc[{i}]", str(i)) for i, r in enumerate(reasonings)])


class Scores:
    """A plain scorer: every action scores 0 except the (removed reasonings, turn) pairs given."""

    def __init__(self, table: dict[tuple[tuple[int, ...], int], float]):
        self.table = table

    def __call__(self, trajectories):
        out = []
        for t in trajectories:
            removed = tuple(i for i, turn in enumerate(t.turns) if not turn.reasoning)
            out.append([self.table.get((removed, j), 0.0) for j in range(len(t.turns))])
        return out


# -- non-finite scores --------------------------------------------------------------------------
@pytest.mark.parametrize("early_reject", [False, True])
def test_a_nan_drop_after_a_finite_one_is_a_non_finite_reject(tmp_path, early_reject, tiny_checkpoint):
    # Removing reasoning 1: d_1 = 5e-4 (fine), d_2 = NaN. Python's max([5e-4, nan]) is 5e-4.
    scorer = Scores({((1,), 1): -5e-4, ((1,), 2): math.nan})
    result = logic_cover([make()], scorer, EPS, early_reject=early_reject)[0]
    entry = result.audit[0]
    assert entry["turn"] == 1 and entry["drops"][0] == pytest.approx(5e-4) and math.isnan(entry["drops"][1])
    assert entry["accepted"] is False and entry["reason"] == NON_FINITE and math.isnan(entry["max_drop"])
    assert 1 not in result.skipped_turns and result.trajectory.turns[1].reasoning == "b"
    assert result.audit[1]["accepted"] is True and result.audit[1]["reason"] is None  # turn 2 is unaffected

    ctx = CoverContext(model_digest="m" * 64, epsilon=EPS, backend="plain", render_mode="plain")
    rows = list(decision_rows([result], Renderer(load_tokenizer(tiny_checkpoint)), ctx))
    write_dataset("decisions", rows, tmp_path / "decisions.parquet")
    table = read_dataset("decisions", tmp_path / "decisions.parquet", as_arrow=True)
    assert table["reason"].to_pylist() == [NON_FINITE, None]
    assert table["accepted"].to_pylist() == [False, True]


@pytest.mark.parametrize("bad", [math.nan, -math.inf, math.inf])
def test_a_non_finite_baseline_score_rejects_every_candidate_it_judges(bad):
    # s_2 (the trajectory as it stands) is not finite: d_2 = s_2 - ℓ̃_2 cannot be trusted, whatever
    # it comes out as (-inf would pass `<= ε`).
    result = logic_cover([make()], Scores({((), 2): bad}), EPS)[0]
    assert [(e["turn"], e["accepted"], e["reason"]) for e in result.audit] == [
        (1, False, NON_FINITE), (2, False, NON_FINITE)]
    assert result.skipped_turns == ()


def test_a_drop_over_epsilon_says_so():
    result = logic_cover([make(("a", "b"))], Scores({((1,), 1): -0.5}), EPS)[0]
    assert result.audit[0]["reason"] == "over_epsilon" and result.audit[0]["accepted"] is False


# -- scorer noise ------------------------------------------------------------------------------
def test_noise_within_a_tenth_of_epsilon_passes_and_more_stops():
    check_noise(0.0, EPS)
    check_noise(EPS / 10, EPS)
    with pytest.raises(ScorerNoiseError):
        check_noise(math.nan, EPS)
    assert issubclass(ScorerNoiseError, ValueError)  # `race` prints it as one line


def test_a_noisy_scorer_stops_the_cover_stage_naming_both_numbers(tmp_path):
    store = ArtifactStore(str(tmp_path / "store"))
    digest, _ = write_dataset_to_store(store, "trajectories", [make(), make(("x", "y"))])
    noisy = as_scorer(Scores({}))
    noisy.measure_noise = lambda requests: 3e-4  # 0.3 ε: batching alone could flip a decision

    with pytest.raises(ScorerNoiseError) as caught:
        stages.cover(store, digest, "unused", "m" * 64, CoverConfig(epsilon=EPS), scorer_factory=lambda: noisy)
    message = str(caught.value)
    assert "3.00e-04" in message and "0.001" in message
    assert "float32" in message and "epsilon" in message and "\n" not in message
    assert store.list_manifests("cover") == []  # nothing committed


# -- code fingerprints -------------------------------------------------------------------------
@pytest.fixture
def source_copy(tmp_path, monkeypatch) -> Path:
    """A copy of the project's packages that the fingerprints read instead of the real ones."""
    root = tmp_path / "src"
    for package in ("race_core", "storage", "tasks"):
        shutil.copytree(REPO / package, root / package, ignore=shutil.ignore_patterns("__pycache__"))
    monkeypatch.setattr(fingerprints, "SOURCE_ROOT", root)
    return root


def _keys(stage_names: tuple[str, ...] | None = None) -> dict[str, dict]:
    return {stage: fingerprints.stage_code(stage, {}) for stage in stage_names or fingerprints.keyed_stages()}


def test_every_stage_has_sources_and_they_all_exist():
    assert set(fingerprints.keyed_stages()) == {"ingest", "cover", "compress", "arm", "sft", "sample", "rl", "evaluate",
                                               "bootstrap"}
    with pytest.raises(ValueError, match="'validate' stores nothing"):  # a check has no key to make
        fingerprints.stage_code("validate", {})
    keys = _keys()  # raises if a listed module is missing
    assert all(set(code) == {"source", "libraries"} for code in keys.values())
    assert len({code["source"] for code in keys.values()}) == len(keys)


@pytest.mark.parametrize(("module", "changed"), [
    ("race_core/train/sft.py", {"sft", "bootstrap"}),
    ("race_core/cover.py", {"cover", "rl"}),
    ("race_core/envs/calculator/environment.py", {"sample", "rl", "evaluate", "bootstrap"}),
    ("race_core/render.py", {"cover", "compress", "arm", "sft", "sample", "rl", "evaluate", "bootstrap"}),
    ("race_core/train/checkpoint_bootstrap.py", {"bootstrap"}),
    ("race_core/tiny.py", set()),
])
def test_editing_a_module_changes_the_keys_of_the_stages_it_computes_and_no_other(source_copy, module, changed):
    before = _keys()
    with (source_copy / module).open("a") as fh:
        fh.write("\n# an edit\n")
    after = _keys()
    assert {stage for stage in before if before[stage] != after[stage]} == changed


def test_an_edited_cover_module_reruns_the_cover_stage_and_not_sft(tmp_path, source_copy):
    store = ArtifactStore(str(tmp_path / "store"))
    runs: list[str] = []

    def run(stage: str) -> dict:
        return stages.run_stage(store, stage, {"epsilon": EPS}, {"x": "1" * 64}, "m" * 64,
                                lambda: runs.append(stage) or {"objects": {}, "metrics": {}})

    assert not run("cover")["cached"] and not run("sft")["cached"]
    assert run("cover")["cached"] and run("sft")["cached"]
    (source_copy / "race_core/cover.py").write_text((source_copy / "race_core/cover.py").read_text() + "\nX = 1\n")
    assert not run("cover")["cached"] and run("sft")["cached"]
    assert runs == ["cover", "sft", "cover"]


def test_a_missing_stage_module_is_an_error_not_a_silent_hole(source_copy):
    (source_copy / "race_core/train/sft.py").unlink()
    with pytest.raises(FileNotFoundError, match="race_core/train/sft.py"):
        fingerprints.stage_code("sft", {})


# -- library versions --------------------------------------------------------------------------
def test_a_library_version_change_changes_the_key_of_stages_that_use_it(monkeypatch):
    before = _keys()
    real = fingerprints.installed_version
    monkeypatch.setattr(fingerprints, "installed_version", lambda name: "9.9.9" if name == "torch" else real(name))
    after = _keys()
    assert {stage for stage in before if before[stage] != after[stage]} == {"cover", "sft", "sample", "rl", "evaluate",
                                                                               "bootstrap"}
    assert after["cover"]["libraries"]["torch"] == "9.9.9"


def test_vllm_is_keyed_only_when_the_stage_runs_on_it(monkeypatch):
    monkeypatch.setattr(fingerprints, "installed_version", lambda name: f"{name}-1")
    assert "vllm" not in fingerprints.stage_code("cover", {"backend": "hf"})["libraries"]
    assert fingerprints.stage_code("cover", {"backend": "vllm"})["libraries"]["vllm"] == "vllm-1"
    assert "vllm" not in fingerprints.stage_code("sample", {"temperature": 1.0})["libraries"]  # hf: left out
    for stage in ("sample", "evaluate"):
        assert fingerprints.stage_code(stage, {"sampler": "vllm"})["libraries"]["vllm"] == "vllm-1"


def test_the_calculator_revision_is_in_the_sample_and_evaluate_keys(monkeypatch):
    keyed: dict[str, dict] = {}
    monkeypatch.setattr(training_stages, "run_stage",
                        lambda store, stage, config, *rest: keyed.setdefault(stage, config))
    policy = training_stages.PolicyRef(digest="p" * 64, path="unused")
    training_stages.sample(None, policy, RLConfig(), Resources(), iteration=0)
    training_stages.evaluate(None, policy, EvalConfig(), Resources())
    assert keyed["sample"]["env_revision"] == keyed["evaluate"]["env_revision"] == ENV_REVISION
    assert keyed["evaluate"]["max_turns"] and keyed["evaluate"]["max_new_tokens"]


# -- checkpoint digest -------------------------------------------------------------------------
def _checkpoint(folder: Path) -> Path:
    folder.mkdir()
    (folder / "config.json").write_text('{"model_type": "llama"}')
    (folder / "model.safetensors").write_bytes(b"weights" * 100)
    (folder / "tokenizer.json").write_text('{"model": {}}')
    (folder / "chat_template.jinja").write_text("{{ messages }}")
    return folder


def test_files_that_are_not_the_model_leave_its_digest_unchanged(tmp_path):
    folder = _checkpoint(tmp_path / "ck")
    digest = checkpoint_digest(folder)
    (folder / "README.md").write_text("# my model")
    (folder / ".git").mkdir()
    (folder / ".git" / "HEAD").write_text("ref: refs/heads/main")
    (folder / ".complete").write_text("x")
    assert checkpoint_digest(folder) == digest


@pytest.mark.parametrize(("name", "content"), [
    ("model.safetensors", b"weightz" * 100),
    ("chat_template.jinja", b"{{ messages | reverse }}"),  # the template decides the render mode
    ("tokenizer.json", b'{"model": {"vocab": {}}}'),
    ("model-00002-of-00002.safetensors", b"more weights"),
])
def test_a_changed_model_file_changes_the_digest(tmp_path, name, content):
    folder = _checkpoint(tmp_path / "ck")
    digest = checkpoint_digest(folder)
    (folder / name).write_bytes(content)
    assert checkpoint_digest(folder) != digest


def test_the_digest_streams_large_weights_in_bounded_chunks(tmp_path):
    folder = _checkpoint(tmp_path / "ck")
    size = 50 << 20
    with (folder / "model.safetensors").open("r+b") as fh:
        fh.truncate(size)
    tracemalloc.start()
    try:
        checkpoint_digest(folder)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 4 * DIGEST_CHUNK < size // 10
