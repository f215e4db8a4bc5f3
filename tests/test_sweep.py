"""`race cover --epsilon E1 E2 ...`: one cover per ε in one pass, sharing scores across ε, on the
real tiny checkpoint, real Parquet and a real store.

On the 8 generated calculator trajectories the tiny model's largest drops lie between -5e-3 and
3e-3 nats (its batching noise is about 1e-7), so ε 2e-4, 1e-3 and 1e-2 remove different turns, and
no drop sits within noise of any of them.
"""

from __future__ import annotations

import json

import pandas as pd
import pytest

from flows.cli import main
from flows.cover import demo_inputs, run_cover
from flows.sweep import epsilon_folder
from race_core.config import PipelineConfig, replace
from tasks.stages import cover_scorer

EPSILONS = (0.0002, 0.001, 0.01)
# |a swept drop - the same drop in a separate run|: the sweep scores a candidate once for every ε, in
# other batches than a run alone; measured 8.7e-8 at most (`pytest -s -k decides` prints it), ~10x.
DROP_ATOL = 1e-6
DECIDED = ["trajectory_id", "turn", "accepted", "reason", "skipped_empty"]


@pytest.fixture(scope="module")
def inputs(tmp_path_factory):
    return demo_inputs(tmp_path_factory.mktemp("home"), n=8, seed=11)


def _cover_args(inputs, checkpoint, out, store, *epsilons) -> list[str]:
    return ["cover", "--input", *inputs, "--checkpoint", str(checkpoint), "--out", str(out),
            "--store", str(store), "--epsilon", *map(str, epsilons)]


@pytest.fixture(scope="module")
def sweep(inputs, tiny_checkpoint, tmp_path_factory):
    """The sweep through the command line, then the same command again (capsys is function-scoped)."""
    import contextlib
    import io

    root = tmp_path_factory.mktemp("sweep")
    args = _cover_args(inputs, tiny_checkpoint, root / "out", root / "store", *EPSILONS)
    printed = []
    for _ in range(2):
        stdout = io.StringIO()
        with contextlib.redirect_stdout(stdout), contextlib.redirect_stderr(io.StringIO()):
            assert main(args) == 0
        printed.append(json.loads(stdout.getvalue()))
    return root, printed[0], printed[1]


@pytest.fixture(scope="module")
def separate_runs(inputs, tiny_checkpoint, tmp_path_factory):
    """Each ε alone, in its own store, with a plain scorer whose counters we keep."""
    runs = {}
    for epsilon in EPSILONS:
        root = tmp_path_factory.mktemp(f"alone-{epsilon}")
        config = replace(PipelineConfig(inputs=tuple(inputs), checkpoint=str(tiny_checkpoint),
                                        store=str(root / "store")), **{"cover.epsilon": epsilon})
        scorers = []

        def factory(config=config, scorers=scorers):
            scorers.append(cover_scorer(config.cover, config.checkpoint, config.resources))
            return scorers[-1]

        run_cover(config, root / "out", root / "home", scorer_factory=factory)
        (scorer,) = scorers
        runs[epsilon] = (root / "out", scorer.stats)
    return runs


def test_each_epsilon_decides_what_a_separate_run_at_that_epsilon_decides(sweep, separate_runs):
    root = sweep[0]
    removed = []
    for epsilon, (alone, _) in separate_runs.items():
        folder = root / "out" / epsilon_folder(epsilon)
        swept, single = (pd.read_parquet(f / "decisions.parquet") for f in (folder, alone))
        assert swept[DECIDED].equals(single[DECIDED]), epsilon
        difference = max(abs(x - y) for a, b in zip(swept["drops"], single["drops"], strict=True)
                         for x, y in zip(a, b, strict=True))
        print(f"measured max |swept - separate| drop at epsilon {epsilon}: {difference:.2e}")
        assert difference <= DROP_ATOL
        assert (swept["epsilon"] == epsilon).all()
        swept_c, single_c = (pd.read_parquet(f / "compressed.parquet") for f in (folder, alone))
        assert swept_c["id"].tolist() == single_c["id"].tolist()
        assert [list(x) for x in swept_c["skipped_turns"]] == [list(x) for x in single_c["skipped_turns"]]
        removed.append(int(swept["accepted"].sum()))
    assert len(set(removed)) == len(EPSILONS), f"the ε values should remove different turns: {removed}"


def test_the_sweep_scores_less_than_the_separate_runs_together(sweep, separate_runs):
    sharing = sweep[1]["sharing"]
    alone = [stats for _, stats in separate_runs.values()]
    # what the sweep was asked for is exactly what the separate runs scored (noise measurements included)
    assert sharing["requests_asked"] == sum(s.requests for s in alone)
    assert sharing["requests_computed"] < sharing["requests_asked"]
    assert sharing["actions_computed"] < sharing["actions_asked"]
    assert sharing["forward_calls"] < sum(s.forward_calls for s in alone)
    assert sharing["tokens_processed"] < sum(s.tokens_processed for s in alone)


def test_the_sweep_writes_its_table_json_and_plot(sweep):
    root, printed, _ = sweep
    out = root / "out"
    written = json.loads((out / "epsilon_sweep.json").read_text())
    assert written["epsilons"] == list(EPSILONS) == printed["epsilons"]
    table = (out / "epsilon_sweep.md").read_text()
    for row in written["rows"]:
        decisions = pd.read_parquet(out / epsilon_folder(row["epsilon"]) / "decisions.parquet")
        scored = decisions[~decisions["skipped_empty"]]
        assert row["candidates"] == len(scored) and row["removed"] == int(decisions["accepted"].sum())
        assert row["removal_share"] == pytest.approx(row["removed"] / row["candidates"])
        assert sorted(row["max_drops"]) == sorted(scored["max_drop"].tolist())
        assert row["drop_p50"] == pytest.approx(scored["max_drop"].median())
        assert row["drop_max"] == pytest.approx(scored["max_drop"].max())
        compressed = pd.read_parquet(out / epsilon_folder(row["epsilon"]) / "compressed.parquet")
        assert row["reasoning_tokens_before"] == int(compressed["reasoning_tokens_before"].sum())
        assert row["reasoning_tokens_kept"] == int(compressed["reasoning_tokens_after"].sum())
        assert f"| {row['epsilon']:g} | {row['candidates']} | {row['removed']} |" in table
    assert (out / "epsilon_sweep.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert "![epsilon sweep](epsilon_sweep.png)" in table


def test_a_rerun_of_the_sweep_computes_nothing(sweep):
    _, first, second = sweep
    assert second["sharing"] == {key: 0 for key in first["sharing"]}
    assert all(r["cover_cached"] for r in second["rows"]) and not any(r["cover_cached"] for r in first["rows"])
    drop_fields = [k for k in first["rows"][0] if k != "cover_cached"]
    assert [{k: r[k] for k in drop_fields} for r in second["rows"]] == [
        {k: r[k] for k in drop_fields} for r in first["rows"]]


def test_one_epsilon_is_the_plain_cover_and_reuses_the_sweeps_stored_decisions(sweep, inputs, tiny_checkpoint,
                                                                               tmp_path, capsys):
    root = sweep[0]
    assert main(_cover_args(inputs, tiny_checkpoint, tmp_path / "out", root / "store", 0.001)) == 0
    summary = json.loads(capsys.readouterr().out)
    assert all(stage["cached"] for stage in summary["stages"].values())  # the sweep stored this ε's key
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == [
        "compressed.parquet", "decisions.parquet", "deletion_rate_by_turn.png", "likelihood_drops.png",
        "rejects.parquet", "report.html", "report.md", "summary.json"]
    swept = pd.read_parquet(root / "out" / epsilon_folder(0.001) / "decisions.parquet")
    assert pd.read_parquet(tmp_path / "out" / "decisions.parquet").equals(swept)


def test_an_epsilon_that_is_not_a_finite_number_in_range_is_named(inputs, tiny_checkpoint, tmp_path, capsys):
    assert main(_cover_args(inputs, tiny_checkpoint, tmp_path / "out", tmp_path / "store", 0.01, "nan")) == 2
    err = capsys.readouterr().err
    assert "--epsilon" in err and "nan" in err
    assert not (tmp_path / "out").exists()
