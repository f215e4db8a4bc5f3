"""The scoring benchmark on a tiny workload: structure of its report, identical decisions across
methods (and what was compared), each method's token counts against counts made here from the
renderings (no timing assertions), the real-checkpoint mode on a JSONL file, the records it keeps
and compares, and the memory bench running the real cover stage."""

from __future__ import annotations

import argparse
import json
import platform
import re
from dataclasses import replace

import pytest
from work_bound import bound_pairs, bound_tokens, full_forward_tokens, head_targets, naive_tokens

from bench.baselines import NaiveScorer
from bench.cli import add_bench_parser
from bench.cli import main as bench_main
from bench.report import format_real_table, format_table
from bench.scoring import (
    BenchOptions,
    MethodRun,
    check_identical,
    compare_decisions,
    decision_mix_note,
    run_bench,
)
from bench.workload import LongWorkload, Workload, long_trajectories, synthetic_trajectories
from race_core.render import OBSERVATION_PREFIX, Renderer

OPTIONS = dict(models=("tiny",), turns=(3,), workload=Workload(n=4), batch_size=4, naive_subset=0, vllm="off",
               demo_data=4, profile=True)


@pytest.fixture(scope="module")
def report(tiny_checkpoint):
    return run_bench(BenchOptions(**OPTIONS, cache_dir=str(tiny_checkpoint.parent)))


def reference_results(tiny_checkpoint, run):
    """The synthetic workload of `run` and hf's cover of it, outside the bench: what the counts
    below are made from."""
    from race_core.cover import logic_cover
    from race_core.policy import load_policy
    from race_core.scoring.hf import HFScorer

    model, tokenizer = load_policy(tiny_checkpoint)
    renderer = Renderer(tokenizer)
    trajectories = synthetic_trajectories(renderer, Workload(**run["workload"]))
    return renderer, logic_cover(trajectories, HFScorer(model, tokenizer, batch_size=4), 1e-3)


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


def test_the_long_workload_draws_agent_shaped_episodes_that_fit_the_context(tiny_policy):
    renderer = Renderer(tiny_policy[1])
    workload = LongWorkload(n=6, turns=(5, 12), observation_tokens=(20, 80), reasoning_tokens=(0, 30),
                            action_tokens=(3, 8))
    episodes = long_trajectories(renderer, workload, context=100_000)
    assert episodes == long_trajectories(renderer, workload, context=100_000)  # deterministic from the seed
    turns = [t for e in episodes for t in e.turns]
    assert all(5 <= len(e.turns) <= 12 for e in episodes) and len({len(e.turns) for e in episodes}) > 1
    # each field's length is drawn per turn from its range (the words are one token each)
    for field, (low, high) in (("reasoning", (0, 30)), ("action", (3, 8)), ("observation", (20, 80))):
        lengths = [len(getattr(t, field).split()) for t in turns]
        assert low <= min(lengths) and max(lengths) <= high and len(set(lengths)) > 3, field
    assert any(not t.reasoning for t in turns)  # a turn that only acts is no candidate
    # cut to the context: the turns kept are a prefix of the episode drawn, within the cap
    cap = 600
    cut = long_trajectories(renderer, workload, context=cap)
    assert all(len(renderer.render(e)) <= cap for e in cut)
    assert all(c.turns == e.turns[:len(c.turns)] for c, e in zip(cut, episodes, strict=True))
    assert sum(len(e.turns) for e in cut) < len(turns)
    with pytest.raises(ValueError, match="episode 0 does not fit 50 tokens in two turns"):
        long_trajectories(renderer, workload, context=50)


def test_the_long_workload_runs_every_method_to_the_same_decisions(tiny_checkpoint):
    long = LongWorkload(n=2, turns=(5, 7), observation_tokens=(20, 60), reasoning_tokens=(0, 40),
                        action_tokens=(3, 8))
    report = run_bench(BenchOptions(models=("tiny",), long=long, batch_size=4, naive=False, vllm="off",
                                    demo_data=0, early_reject=False, cache_dir=str(tiny_checkpoint.parent)))
    (run,) = report["runs"]
    assert run["workload"] == "long" and run["N"] == 2 and run["decisions_identical"]
    # naive skipped (--no-naive): said so; the copying path beside hf, which reads prefixes in place
    assert [m["name"] for m in run["methods"]] == ["hf", "hf (prefix copied)", "full-forward"]
    assert "naive skipped: --no-naive" in run["notes"] and "| n/a |" in format_table(run)
    low, high = map(int, run["T"].split("-"))
    assert 5 <= low <= high <= 7 and run["tokens"] > 0
    # the bound with attention: the pairs every fed token must attend over, counted here from the
    # renderings; prefixes read in place compute them and the padded queries' pairs of the new part,
    # fewer than the copying path (a row's queries over the batch's longest prefix)
    from race_core.cover import DEFAULT_EPSILON, logic_cover
    from race_core.policy import load_policy
    from race_core.scoring.hf import HFScorer

    model, tokenizer = load_policy(tiny_checkpoint)
    renderer = Renderer(tokenizer)
    results = logic_cover(long_trajectories(renderer, long, model.config.max_position_embeddings),
                          HFScorer(model, tokenizer, batch_size=4), DEFAULT_EPSILON)
    attention = run["bound"]["attention"]
    hf, copied = (next(m for m in run["methods"] if m["name"] == name) for name in ("hf", "hf (prefix copied)"))
    assert attention["pairs"] == bound_pairs(renderer, results) > run["bound"]["tokens"]
    assert attention["pairs"] <= hf["work"]["attention_pairs"] < copied["work"]["attention_pairs"]
    assert attention["per_token_s"] > 0 and attention["per_pair_s"] >= 0 and len(attention["shapes"]) >= 2
    assert attention["wall_s"] == pytest.approx(run["bound"]["tokens"] * attention["per_token_s"]
                                                + attention["pairs"] * attention["per_pair_s"])
    assert hf["time_vs_attention_bound"] == pytest.approx(hf["wall_s"] / attention["wall_s"])
    assert "the bound with attention:" in format_table(run)


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
    assert [c["method"] for c in compared["methods"]] == ["hf+early-reject", "hf (prefix copied)", "full-forward",
                                                          "naive"]
    for c in compared["methods"]:
        assert (c["trajectories"], c["candidates"], c["identical"]) == (4, run["candidates"], True)
    assert run["candidates"] > 0
    methods = {m["name"]: m for m in run["methods"]}
    assert {"naive", "full-forward", "hf", "hf+early-reject"} <= set(methods)
    for m in methods.values():
        assert {"name", "wall_s", "tokens_processed", "speedup_vs_naive", "time_vs_bound"} <= set(m)
        assert m["speedup_vs_naive"] > 0 and m["time_vs_bound"] > 0 and m["wall_s"] > 0
    assert run["bound"]["wall_s"] > 0
    fastest = max(m["forward_tokens_per_s_before"] for m in methods.values())
    assert run["bound"]["forward_tokens_per_s"] == fastest  # measured before each method; the bound: the fastest
    for m in methods.values():
        assert m["bound_wall_s"] == run["bound"]["wall_s"] == pytest.approx(run["bound"]["tokens"] / fastest)
        assert m["time_vs_bound"] == pytest.approx(m["wall_s"] / m["bound_wall_s"])
        assert m["work"]["tokens_processed"] == m["tokens_processed"]  # all ran on all 4: nothing scaled
    assert methods["hf"]["forward_overhead"] >= 1 and methods["hf"]["overhead_measured"] is True
    # the heap grown before any method is timed: by an untimed hf cover of the same workload
    assert run["warm_up"]["method"] == "hf" and run["warm_up"]["wall_s"] > 0
    if platform.system() == "Linux":  # page faults counted per method, the warm-up's among them (a heap that
        # earlier tests grew may need no fresh page, so only that each is a count)
        counts = [run["warm_up"]["page_faults"]] + [m["page_faults"] for m in methods.values()]
        assert all(isinstance(c, int) and c >= 0 for c in counts), counts
    assert "vllm skipped" in " ".join(run["notes"])
    assert "| naive |" in format_table(run) and "| hf | " in format_table(run).split("work counters")[1]
    demo = report["demo_early_reject"]
    assert demo["decisions_identical"] is True
    assert demo["decisions_compared"] == {"reference": "hf", "methods": [
        {"method": "hf+early-reject", "trajectories": 4, "candidates": demo["candidates"], "identical": True}]}
    assert demo["hf+early-reject"]["tokens_processed"] <= demo["hf"]["tokens_processed"]


def test_the_profile_splits_each_forward_the_counters_saw(report):
    from bench.profile import PARTS, format_profile

    (run,) = report["runs"]
    profile, hf = run["profile"], next(m for m in run["methods"] if m["name"] == "hf")["work"]
    forwards = profile["forwards"]
    assert len(forwards) == hf["forward_calls"] and sum(f["rows"] for f in forwards) == hf["rows"]
    assert sum(f["rows"] * f["fed"] for f in forwards) == hf["padded_positions"]
    assert forwards[0]["prefix"] == 0 and any(f["prefix"] > 0 for f in forwards)  # round 0, then cached rounds
    for f in forwards:
        assert sum(f[part] for part in PARTS) == pytest.approx(f["seconds"]) and f["matmul"] > 0
        # prefixes read in place (the tiny Llama on a CPU): every row's fed keys/values written once, and
        # the attention over a prefix only where there is one
        assert f["kv write"] > 0 and (f["prefix attention"] > 0) == (f["prefix"] > 0), f
    text = format_profile(profile, "tiny T=3")
    assert "| attention |" in text and "| prefix attention |" in text and "| kv write |" in text


def test_each_method_feeds_the_tokens_its_algorithm_implies(report, tiny_checkpoint):
    """Counted here from the renderings of the same cover: hf feeds the work bound, full-forward
    every trajectory and candidate whole, naive one prefix per turn of each; and each method's
    forwards and rows are what its batching implies."""
    (run,) = report["runs"]
    renderer, results = reference_results(tiny_checkpoint, run)
    methods = {m["name"]: m for m in run["methods"]}
    bound = bound_tokens(renderer, results)
    assert run["bound"]["tokens"] == bound
    # what the bound's raw forward leaves out: the head over the scored action tokens
    assert run["bound"]["head_targets"] == head_targets(renderer, results) > 0
    assert run["bound"]["head_wall_s"] == pytest.approx(run["bound"]["head_targets"] / run["bound"]["head_tokens_per_s"])
    for m in methods.values():
        with_head = m["wall_s"] / (run["bound"]["wall_s"] + run["bound"]["head_wall_s"])
        assert m["time_vs_bound_with_head"] == pytest.approx(with_head) and with_head < m["time_vs_bound"]
    assert "against the bound with the head, hf " in format_table(run)
    assert methods["hf"]["tokens_processed"] == bound  # prefix reuse feeds exactly the bound
    assert methods["hf+early-reject"]["tokens_processed"] < bound
    assert methods["full-forward"]["tokens_processed"] == full_forward_tokens(renderer, results)
    assert methods["naive"]["tokens_processed"] == naive_tokens(renderer, results)
    scored = 4 + run["candidates"]  # each trajectory in full, then each candidate
    full, naive = methods["full-forward"]["work"], methods["naive"]["work"]
    assert full["forward_calls"] == full["rows"] == scored and full["padded_positions"] == full["tokens_processed"]
    assert naive["forward_calls"] == 3 * scored  # one per turn (T=3) of each
    hf = methods["hf"]["work"]
    assert hf["rows"] == scored and 3 <= hf["forward_calls"] <= scored  # rounds 0..2, at most one per row
    assert hf["padded_positions"] >= hf["tokens_processed"]


@pytest.fixture(scope="module")
def real_run(tiny_checkpoint, tmp_path_factory):
    """`bench_scoring --checkpoint --input` on expert trajectories in a JSONL file with one bad line."""
    from race_core.envs.expert import expert_dataset

    folder = tmp_path_factory.mktemp("real-bench")
    data = folder / "expert.jsonl"
    lines = [json.dumps(t.to_dict()) for t in expert_dataset(6, seed=1)]
    data.write_text("\n".join([*lines[:3], '{"question": "no turns"}', *lines[3:]]) + "\n")
    out = folder / "report.json"
    assert bench_main(["--checkpoint", str(tiny_checkpoint), "--input", str(data), "--batch-size", "4",
                       "--naive-subset", "2", "--vllm", "off", "--json", str(out),
                       "--record", str(folder / "records"), "--label", "expert"]) == 0
    return json.loads(out.read_text()), data


def test_real_checkpoint_bench_makes_the_same_decisions_with_every_method(real_run):
    report, data = real_run
    assert report["mode"] == "checkpoint"
    (run,) = report["runs"]
    assert (run["N"], run["input"], run["epsilon"]) == (6, str(data), 0.001)
    assert run["decisions_identical"] is True
    assert [c["method"] for c in run["decisions_compared"]["methods"]] == ["hf+early-reject", "hf (prefix copied)",
                                                                           "full-forward", "naive"]
    assert all(c["identical"] for c in run["decisions_compared"]["methods"])
    methods = {m["name"]: m for m in run["methods"]}
    assert set(methods) == {"hf", "hf+early-reject", "hf (prefix copied)", "full-forward", "naive"}
    assert methods["naive"]["measured_on"] == 2 and methods["hf"]["measured_on"] == 6
    assert 0 < run["accepted_removals"] < run["candidates"]  # ε 0.001 gives mixed decisions on these
    for name in ("hf", "hf+early-reject", "full-forward"):  # run on all 6: the same mix as hf
        assert (methods[name]["accepted_removals"], methods[name]["candidates"]) == (
            run["accepted_removals"], run["candidates"])
    bound = run["bound"]
    assert bound["tokens"] > 0 and bound["wall_s"] > 0 and bound["forward_tokens_per_s"] > 0
    assert methods["hf"]["tokens_processed"] == bound["tokens"]  # prefix reuse feeds exactly the bound
    assert methods["hf"]["tokens_vs_bound"] == 1.0
    assert methods["hf+early-reject"]["tokens_vs_bound"] <= 1.0 < methods["full-forward"]["tokens_vs_bound"]
    for m in methods.values():
        assert m["time_vs_bound"] == pytest.approx(m["wall_s"] / m["bound_wall_s"])
    assert 0 <= run["scorer_noise"] < 1e-4


def test_real_checkpoint_bench_counts_against_the_renderings(real_run, tiny_checkpoint):
    """The bound and each method's tokens, counted here from the file's trajectories."""
    from race_core.cover import logic_cover
    from race_core.policy import load_policy
    from race_core.schema import read_jsonl
    from race_core.scoring.hf import HFScorer

    report, data = real_run
    (run,) = report["runs"]
    model, tokenizer = load_policy(tiny_checkpoint)
    renderer = Renderer(tokenizer)
    good, _ = read_jsonl([str(data)])
    results = logic_cover(good, HFScorer(model, tokenizer, batch_size=4), run["epsilon"])
    methods = {m["name"]: m for m in run["methods"]}
    assert run["bound"]["tokens"] == methods["hf"]["tokens_processed"] == bound_tokens(renderer, results)
    assert methods["full-forward"]["tokens_processed"] == full_forward_tokens(renderer, results)
    assert methods["naive"]["work"]["tokens_processed"] == naive_tokens(renderer, results[:2])  # timed on 2


def test_real_checkpoint_bench_reports_the_rejected_line(real_run):
    report, data = real_run
    (run,) = report["runs"]
    assert run["rejects"] == 1
    assert (run["first_rejects"][0]["file"], run["first_rejects"][0]["line"]) == (str(data), 4)
    table = format_real_table(run)
    assert f"{data}:4 [" in table
    hf_row = next(line for line in table.splitlines() if line.startswith("| hf |"))
    assert hf_row.endswith(f"| {run['accepted_removals']} / {run['candidates']} |")
    assert "| hf+early-reject |" in table and "| work bound |" in table


def test_real_checkpoint_bench_refuses_an_input_with_nothing_to_score(tiny_checkpoint, tmp_path):
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"question": "no turns"}\nnot json\n')
    with pytest.raises(ValueError, match=re.escape(f"--input '{bad}': no trajectory to score (2 rejected; first: line 1")):
        run_bench(BenchOptions(checkpoint=str(tiny_checkpoint), input=str(bad), vllm="off"))
    missing = tmp_path / "missing.jsonl"
    with pytest.raises(FileNotFoundError, match=re.escape(f"--input '{missing}': no such file")):
        run_bench(BenchOptions(checkpoint=str(tiny_checkpoint), input=str(missing), vllm="off"))
    with pytest.raises(ValueError, match="--checkpoint goes with --input FILE.jsonl or --workload long"):
        run_bench(BenchOptions(checkpoint=str(tiny_checkpoint), vllm="off"))


def test_decision_mix_note_names_the_epsilon_when_decisions_are_all_alike():
    assert decision_mix_note(3, 7, 0.5) is None
    assert "0.5 rejected every candidate" in decision_mix_note(0, 7, 0.5)
    assert "2 accepted every candidate" in decision_mix_note(7, 7, 2.0)
    assert "no candidate" in decision_mix_note(0, 0, 0.5)


def test_race_bench_scoring_parses(tmp_path):
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




def test_a_record_keeps_commit_machine_and_figures_and_compares_and_tables(real_run, capsys):
    import os
    import subprocess

    from bench import records

    report, data = real_run
    (path,) = (data.parent / "records").iterdir()
    assert path.name.endswith("-expert.json")
    kept = records.read(path)
    head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=records.REPO_ROOT, capture_output=True, text=True).stdout
    assert kept["commit"] == head.strip() and isinstance(kept["dirty"], bool)
    assert kept["machine"]["logical_cores"] == os.cpu_count() and kept["machine"]["torch_threads"] >= 1
    assert len(kept["load"]["before"]) == len(kept["load"]["after"]) == 3
    assert kept["arguments"]["input"] == str(data) and kept["runs"] == report["runs"]
    again = records.record(report, path.parent)  # a second record is a new file, the first stays
    assert again != path and records.read(path) == kept

    parser = argparse.ArgumentParser(prog="race")
    add_bench_parser(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(["bench", "compare", str(path), str(again)])
    assert args.func(args) == 0
    compared = capsys.readouterr().out
    (run,) = report["runs"]
    forwards = next(m for m in run["methods"] if m["name"] == "hf")["work"]["forward_calls"]
    assert f"| hf | forward_calls | {forwards:,} | {forwards:,} | 1.00 |" in compared
    assert compared.startswith(f"{path.name}: {kept['machine']['processor']} (")

    readme = path.parent / "README.md"
    readme.write_text(f"# Title\n{records.TABLE_START}\nold table\n{records.TABLE_END}\nafter\n")
    args = parser.parse_args(["bench", "table", str(path), "--out", str(path.parent / "table.md"),
                              "--readme", str(readme)])
    assert args.func(args) == 0
    table = (path.parent / "table.md").read_text()
    assert readme.read_text() == f"# Title\n{records.TABLE_START}\n{table}{records.TABLE_END}\nafter\n"
    readme.write_text("no markers\n")
    with pytest.raises(ValueError, match="needs one line"):
        records.replace_table(readme, table)
    hf = next(m for m in run["methods"] if m["name"] == "hf")
    assert (f"| [1] | M1 | {run['model']} | 6 | {run['T']} | hf | {hf['wall_s']:,.2f} | {hf['time_vs_bound']:.2f}x | "
            f"{hf['time_vs_bound_with_head']:.2f}x | ") in table
    assert f"| [1] | M1 | {run['model']} | 6 | {run['T']} | work bound | " in table
    assert f"M1: {records.machine_label(kept)}" in table and kept["machine"]["processor"] in table
    assert f"[1] `{path.name}`: {kept['machine']['processor']}" in table and kept["commit"][:8] in table


def test_a_record_from_before_the_fastest_bound_is_read_with_it(tmp_path):
    """Records written when each method's ratio used its own raw-forward measurement (a hand-made one
    here) are read with the bound every method now shares: the fastest measurement."""
    from bench import records

    old = {"runs": [{"model": "m", "N": 4, "T": 2, "bound": {
        "tokens": 1000, "wall_s": 2.0, "forward_tokens_per_s": 500.0, "cpu_s": 4.0, "forward_tokens_per_cpu_s": 250.0,
        "measured": "just before each method (its own bound_wall_s, bound_cpu_s); this row: hf's"}, "methods": [
        {"name": "hf", "wall_s": 2.0, "cpu_s": 4.0, "time_vs_bound": 1.0, "cpu_vs_bound": 1.0, "bound_wall_s": 2.0,
         "bound_cpu_s": 4.0},
        {"name": "naive", "wall_s": 6.0, "cpu_s": 12.0, "time_vs_bound": 3.75, "cpu_vs_bound": 3.75,
         "bound_wall_s": 1.6, "bound_cpu_s": 3.2}]}]}
    path = tmp_path / "old.json"
    path.write_text(json.dumps(old))
    (run,) = records.read(path)["runs"]
    hf, naive = run["methods"]
    assert run["bound"]["wall_s"] == hf["bound_wall_s"] == naive["bound_wall_s"] == 1.6
    assert (hf["time_vs_bound"], naive["time_vs_bound"]) == (pytest.approx(1.25), pytest.approx(3.75))
    assert (hf["cpu_vs_bound"], run["bound"]["forward_tokens_per_s"]) == (pytest.approx(1.25), 625.0)
    assert hf["forward_tokens_per_s_before"] == 500.0 and json.loads(path.read_text()) == old  # the file as it was


def test_a_file_that_is_not_a_record_is_named(tmp_path):
    from bench import records

    bad = tmp_path / "bad.json"
    bad.write_text('{"memory": []}')
    with pytest.raises(ValueError, match=re.escape(f"benchmark record {str(bad)!r} has no 'runs' list")):
        records.read(bad)
    with pytest.raises(FileNotFoundError, match="no such file"):
        records.read(tmp_path / "missing.json")


def test_the_table_groups_records_by_cpu_and_its_matrix_extensions():
    """Records of the repository (all from one AMD EPYC, written before the matrix extensions were
    recorded) beside one moved to another CPU: each machine gets its own label and its rows stay
    together, whatever order the records are given in."""
    from bench import records

    paths = sorted(records.REPO_ROOT.glob("bench/results/*-20m.json"))[:2]
    epyc = [(p.name, records.read(p)) for p in paths]
    xeon = {**epyc[0][1], "machine": {**epyc[0][1]["machine"], "processor": "Intel(R) Xeon(R) Processor",
                                      "cpu_vendor": "GenuineIntel", "matrix_extensions": ["amx_bf16", "avx512_bf16"]}}
    text = records.table([epyc[0], ("xeon.json", xeon), epyc[1]])
    assert "M1: AMD EPYC (matrix extensions not recorded)" in text
    assert "M2: Intel(R) Xeon(R) Processor (amx_bf16, avx512_bf16)" in text
    machines = [line.split(" | ")[1] for line in text.splitlines() if line.startswith("| [")]
    assert machines == sorted(machines) and set(machines) == {"M1", "M2"}  # M1's rows, then M2's
    assert [line.split(" | ")[0] for line in text.splitlines() if " | M2 | " in line] == ["| [3]"] * machines.count("M2")


def test_the_latest_table_keeps_each_workloads_newest_run_on_each_machine():
    """`race bench table --latest` (the README's): a newer record of T=8 alone takes that run's place
    and the older record keeps its T=16 run; the same record moved to another CPU is another
    machine's newest; a record left with no run is dropped."""
    from bench import records

    old = records.read(sorted(records.REPO_ROOT.glob("bench/results/*-20m.json"))[0])
    assert [run["T"] for run in old["runs"]] == [8, 16]
    newer_t8 = {**old, "recorded_at": "2099-01-01T00:00:00+00:00", "runs": old["runs"][:1]}
    newest_both = {**old, "recorded_at": "2099-02-01T00:00:00+00:00"}
    xeon = {**old, "machine": {**old["machine"], "processor": "Intel(R) Xeon(R) Processor",
                               "matrix_extensions": ["amx_bf16"]}}
    kept = records.latest([("old.json", old), ("t8.json", newer_t8), ("xeon.json", xeon)])
    assert [(name, [run["T"] for run in data["runs"]]) for name, data in kept] == [
        ("old.json", [16]), ("t8.json", [8]), ("xeon.json", [8, 16])]
    kept = records.latest([("old.json", old), ("t8.json", newer_t8), ("both.json", newest_both)])
    assert [name for name, _ in kept] == ["both.json"]
    text = records.table(kept)
    assert "[1] `both.json`" in text and "old.json" not in text and "t8.json" not in text


def test_the_dtypes_bench_compares_each_dtype_with_the_reference_on_the_same_episodes(tiny_checkpoint):
    """`race bench dtypes` on the tiny model: the reference (float32) against itself is exact; bfloat16's
    drift, decisions and fitness are computed against it, and the CPU's matrix extensions are named."""
    from bench.dtypes import FIT_MARGIN, format_dtypes, run_dtypes
    from race_core.cpu import cpu_facts
    from race_core.policy import load_tokenizer

    renderer = Renderer(load_tokenizer(tiny_checkpoint))
    episodes = long_trajectories(renderer, LongWorkload(n=2, turns=(3, 4), observation_tokens=(10, 30),
                                                        reasoning_tokens=(5, 20), action_tokens=(3, 6)), 4096)
    report = run_dtypes(str(tiny_checkpoint), episodes, ("float32", "bfloat16"), (0.3, 1e-3), batch_size=4)
    reference, bf16 = report["runs"]
    assert report["cpu"] == cpu_facts() and report["reference"] == "float32"
    assert reference["forward_speedup"] == 1.0
    for cover in reference["covers"]:
        assert cover["decisions_equal"] and cover["drift"] == 0.0 and cover["speedup"] == 1.0
        assert cover["drift_compared"] == cover["candidates"] > 0
    for cover in bf16["covers"]:
        assert cover["drift"] > 0.0  # bfloat16 rounds the scores: its drops move
        assert cover["fit"] == (cover["decisions_equal"] and cover["drift"] <= cover["epsilon"] / FIT_MARGIN
                                and bf16["noise"] <= cover["epsilon"] / FIT_MARGIN)
    table = format_dtypes(report)
    assert table.count("| bfloat16 |") == 2 and cpu_facts()["model"] in table


def test_the_sampling_bench_plays_the_same_tasks_with_each_backend_and_counts_what_they_read(tiny_checkpoint):
    """`race bench sampling` on the tiny model, the transformers sampler against itself (vLLM's engine is
    tested in test_vllm_*): greedy decoding plays the same episodes token for token, and the prompt
    tokens it reports are what the sampler was handed, counted by a recording wrapper around the real
    sampler (the wrapper only counts)."""
    from bench.sampling import _prompt_tokens, format_sampling, run_sampling
    from race_core.envs import get_environment
    from race_core.envs.agent import AgentPrompt
    from race_core.rollout import run_rollouts
    from race_core.sampling import SamplingParams
    from race_core.sampling.hf import HFSampler

    report = run_sampling(str(tiny_checkpoint), "calculator", tasks=2, samples=1, temperature=0.0, max_new_tokens=8,
                          max_turns=3, backends=("hf", "hf"), batch_size=4)
    first, second = report["runs"]
    assert first["episodes"] == second["episodes"] == 2 and second["episodes_as_reference"] == 2
    assert first["generated_tokens"] == second["generated_tokens"] > 0 and first["play_speedup"] == 1.0
    assert first["turns"] >= first["well_formed_turns"] and 2 <= first["turns"] <= 6

    class Recording:  # counts the prompts handed to a real sampler; samples nothing itself
        def __init__(self, inner):
            self.inner, self.renderer, self.read = inner, inner.renderer, 0

        def sample(self, prompts, params):
            self.read += sum(len(p) for p in prompts)
            return self.inner.sample(prompts, params)

    sampler = Recording(HFSampler.from_pretrained(str(tiny_checkpoint), batch_size=4))
    env = get_environment("calculator")
    rollouts = run_rollouts(sampler, sampler.renderer, env.heldout_tasks(2, 0), 1,
                            SamplingParams(temperature=0.0, max_new_tokens=8), 3, 0,
                            AgentPrompt.for_renderer(sampler.renderer, env))
    assert _prompt_tokens(rollouts) == sampler.read == first["prompt_tokens"]
    assert "| hf |" in format_sampling(report) and "episodes as hf's" in format_sampling(report)
