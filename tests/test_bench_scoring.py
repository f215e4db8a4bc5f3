"""The scoring benchmark on a tiny workload: structure of its report, identical decisions across
methods (and what was compared), the token counts ordered as the algorithms imply (no timing
assertions), and the memory bench running the real cover stage."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest

from bench.baselines import NaiveScorer
from bench.cli import add_bench_parser
from bench.report import format_table
from bench.scoring import BenchOptions, MethodRun, check_identical, compare_decisions, run_bench
from bench.workload import Workload, synthetic_trajectories
from race_core.render import OBSERVATION_PREFIX, Renderer


@pytest.fixture(scope="module")
def report(tiny_checkpoint):
    options = BenchOptions(models=("tiny",), turns=(3,), workload=Workload(n=4), batch_size=4, naive_subset=0,
                           vllm="off", demo_data=4, cache_dir=str(tiny_checkpoint.parent))
    return run_bench(options)


def test_synthetic_fields_have_exact_token_lengths(tiny_policy):
    renderer = Renderer(tiny_policy[1])
    workload = Workload(n=3, turns=2, question_tokens=5, reasoning_tokens=7, action_tokens=3, observation_tokens=4)
    trajectories = synthetic_trajectories(renderer, workload)
    assert trajectories == synthetic_trajectories(renderer, workload)  # deterministic from the seed
    for trajectory in trajectories:
        for turn in trajectory.turns:
            assert len(renderer.encode(turn.reasoning)) == 7
            assert len(renderer.encode(turn.action)) == 3
            obs = renderer.encode(OBSERVATION_PREFIX + turn.observation)
            assert len(obs) - len(renderer.encode(OBSERVATION_PREFIX)) == 4


def test_naive_scorer_matches_the_hf_scorer(tiny_policy, expert_trajectories):
    from race_core.scoring import ScoreRequest
    from race_core.scoring.hf import HFScorer

    model, tokenizer = tiny_policy
    requests = [ScoreRequest(i, t, from_turn=1) for i, t in enumerate(expert_trajectories[:3])]
    naive = NaiveScorer(model, Renderer(tokenizer)).score(requests)
    ours = HFScorer(model, tokenizer, batch_size=3).score(requests)
    for a, b in zip(naive, ours, strict=True):
        assert a == pytest.approx(b, abs=1e-5)


def test_bench_report_structure_and_identical_decisions(report):
    json.dumps(report)  # JSON-ready
    (run,) = report["runs"]
    assert (run["model"], run["N"], run["T"]) == ("tiny", 4, 3)
    assert run["decisions_identical"] is True
    compared = run["decisions_compared"]
    assert compared["reference"] == "hf"
    assert [c["method"] for c in compared["methods"]] == ["hf+early-reject", "full-forward", "naive"]
    for c in compared["methods"]:
        assert (c["trajectories"], c["candidates"], c["identical"]) == (4, run["candidates"], True)
    assert run["candidates"] > 0
    methods = {m["name"]: m for m in run["methods"]}
    assert {"naive", "full-forward", "hf", "hf+early-reject"} <= set(methods)
    for m in methods.values():
        assert {"name", "wall_s", "tokens_processed", "speedup_vs_naive", "time_vs_bound"} <= set(m)
        assert m["speedup_vs_naive"] > 0 and m["time_vs_bound"] > 0 and m["wall_s"] > 0
    assert run["bound"]["tokens"] > 0 and run["bound"]["wall_s"] > 0
    assert run["bound"]["tokens"] < methods["full-forward"]["tokens_processed"] < methods["naive"]["tokens_processed"]
    assert methods["hf"]["tokens_processed"] == run["bound"]["tokens"]  # prefix reuse feeds exactly the bound
    assert methods["hf+early-reject"]["tokens_processed"] <= run["bound"]["tokens"]
    assert "vllm skipped" in " ".join(run["notes"])
    assert "| naive |" in format_table(run)
    demo = report["demo_early_reject"]
    assert demo["decisions_identical"] is True
    assert demo["decisions_compared"] == {"reference": "hf", "methods": [
        {"method": "hf+early-reject", "trajectories": 4, "candidates": demo["candidates"], "identical": True}]}
    assert demo["hf+early-reject"]["tokens_processed"] <= demo["hf"]["tokens_processed"]


def test_race_bench_scoring_parses(tmp_path):
    import argparse

    parser = argparse.ArgumentParser(prog="race")
    add_bench_parser(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(["bench", "scoring", "--json", str(tmp_path / "r.json"), "--sweep", "--n", "8"])
    assert args.func.__name__ == "cmd_bench_scoring" and args.sweep and args.n == 8


def test_a_method_with_other_decisions_fails_the_comparison(expert_trajectories):
    from race_core.cover import logic_cover

    results = logic_cover(expert_trajectories[:2], lambda ts: [[0.0] * len(t.turns) for t in ts])
    flipped = [replace(results[0], audit=[{**a, "accepted": not a["accepted"]} for a in results[0].audit])]
    reference = MethodRun("hf", 1.0, 1.0, 0, 2, results)
    comparison = compare_decisions(reference, [MethodRun("same", 1.0, 1.0, 0, 2, list(results)),
                                               MethodRun("subset", 1.0, 1.0, 0, 1, results[:1]),
                                               MethodRun("other", 1.0, 1.0, 0, 1, flipped)])
    assert [(c["method"], c["trajectories"], c["identical"]) for c in comparison["methods"]] == [
        ("same", 2, True), ("subset", 1, True), ("other", 1, False)]
    with pytest.raises(AssertionError, match="other"):
        check_identical(comparison)


def test_memory_bench_runs_the_cover_stage(tiny_checkpoint):
    from bench.memory import memory_child

    row = memory_child("tiny", str(tiny_checkpoint.parent), n=3, shard_size=2, turns=2, batch_size=2)
    assert (row["N"], row["shard_size"], row["T"]) == (3, 2, 2)
    assert 0 <= row["accepted_removals"] <= 3
    assert row["peak_rss_mb"] >= row["rss_after_load_mb"] > 0
