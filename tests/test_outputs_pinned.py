"""What users keep, pinned on real files: `compressed.parquet` turn by turn against the input and
`decisions.parquet`, and `race report` from a real summary (the OOM backoff: tests/test_kv_budget.py)."""

import contextlib
import io
import json

import pandas as pd
import pyarrow.parquet as pq
import pytest

from flows.cli import main

CONTRACT_KEYS = {"question", "environment", "source_revision", "split", "successful", "turns", "id"}


@pytest.fixture(scope="module")
def covered(tmp_path_factory, tiny_checkpoint):
    """One real `race cover` run on the generated demo inputs: (home, out, printed summary)."""
    root = tmp_path_factory.mktemp("cover")
    home, out = root / "home", root / "out"
    stdout = io.StringIO()
    with contextlib.redirect_stdout(stdout):
        rc = main(["cover", "--checkpoint", str(tiny_checkpoint), "--out", str(out), "--home", str(home),
                   "--epsilon", "0.002"])
    assert rc == 0
    return home, out, json.loads(stdout.getvalue())


def test_compressed_parquet_matches_the_input_and_the_decisions(covered, tiny_checkpoint):
    from flows.cover import demo_inputs
    from race_core.policy import load_tokenizer
    from race_core.schema import read_jsonl

    home, out, summary = covered
    inputs = demo_inputs(home)
    raw = [json.loads(line) for path in inputs for line in open(path) if line.strip()]
    parsed, rejects = read_jsonl(inputs)
    assert not rejects and len(parsed) == len(raw) > 0
    originals = {t.id: (t, r) for t, r in zip(parsed, raw, strict=True)}

    compressed = pq.read_table(out / "compressed.parquet").to_pylist()
    decisions = pq.read_table(out / "decisions.parquet").to_pandas()
    assert len(compressed) == len(originals) == summary["trajectories"]["ingested"]
    assert {row["id"] for row in compressed} == set(originals)
    assert set(decisions["trajectory_id"]) <= set(originals)
    assert not decisions.duplicated(["trajectory_id", "turn"]).any()
    assert decisions["accepted"].any() and (~decisions["accepted"]).any()  # both sides are exercised
    accepted_by_id = {tid: sorted(int(t) for t in g.loc[g["accepted"], "turn"])
                      for tid, g in decisions.groupby("trajectory_id")}

    tokenizer = load_tokenizer(tiny_checkpoint)

    def tokens(text: str) -> int:  # the tokenizer itself, not the renderer or race_core.decisions
        return len(tokenizer(text, add_special_tokens=False).input_ids)
    total_before = total_after = removed = 0
    for row in compressed:
        original, line = originals[row["id"]]
        accepted = accepted_by_id.get(row["id"], [])
        assert list(row["skipped_turns"]) == accepted, row["id"]
        assert 0 not in accepted  # turn 0 is never removed
        for field in ("question", "environment", "source_revision"):
            assert row[field] == line[field] == getattr(original, field)
        assert row["split"] == "train" and row["successful"] is True
        assert json.loads(row["extra"] or "{}") == {k: v for k, v in line.items() if k not in CONTRACT_KEYS}
        assert json.loads(row["extra"] or "{}") == original.extra
        assert len(row["turns"]) == len(line["turns"]) == len(original.turns)
        for t, (kept, given) in enumerate(zip(row["turns"], line["turns"], strict=True)):
            assert kept["action"] == given["action"], (row["id"], t)
            assert kept["observation"] == given.get("observation", ""), (row["id"], t)
            if t in accepted:
                assert kept["reasoning"] == "", (row["id"], t)
                assert given["reasoning"] != ""  # an accepted decision removed real reasoning
            else:
                assert kept["reasoning"] == given["reasoning"], (row["id"], t)

        before, after = row["reasoning_tokens_before"], row["reasoning_tokens_after"]
        assert before == sum(tokens(turn["reasoning"]) for turn in line["turns"])  # the input line's own text
        assert after == sum(tokens(turn["reasoning"]) for t, turn in enumerate(line["turns"]) if t not in accepted)
        assert before >= after
        if not accepted:
            assert before == after
        mine = decisions[(decisions["trajectory_id"] == row["id"]) & decisions["accepted"]]
        assert before - after == int(mine["reasoning_tokens"].sum())
        assert row["epsilon"] == 0.002 and row["model_digest"] == summary["model_digest"]
        total_before, total_after, removed = total_before + before, total_after + after, removed + len(accepted)

    assert summary["cover"]["removed"] == removed == int(decisions["accepted"].sum())
    assert summary["cover"]["reasoning_tokens_before"] == total_before
    assert summary["cover"]["reasoning_tokens_after"] == total_after


def _report_summary(covered, path):
    home, _, cover_summary = covered
    summary = {**cover_summary, "run": {"store": str(home / "store")}}
    assert summary["objects"]["decisions"]
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(summary))
    return cover_summary


def _assert_report(folder, cover_summary):
    text = (folder / "report.md").read_text()
    cover = cover_summary["cover"]
    before, after = cover["reasoning_tokens_before"], cover["reasoning_tokens_after"]
    assert f"trajectories ingested: {cover_summary['trajectories']['ingested']}" in text
    assert f"candidate turns scored: {cover['candidates']}, reasoning removed in: {cover['removed']}" in text
    assert f"reasoning tokens: {before} -> {after}" in text
    for png in ("deletion_rate_by_turn.png", "likelihood_drops.png"):
        assert (folder / png).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n", png
        assert f"({png})" in text
    assert json.loads((folder / "summary.json").read_text())["cover"] == cover


def test_report_reads_the_decisions_from_the_store_named_in_the_summary(covered, tmp_path, capsys):
    path = tmp_path / "run" / "summary.json"
    cover_summary = _report_summary(covered, path)
    assert main(["report", "--summary", str(path)]) == 0
    assert f"report: {tmp_path / 'run' / 'report.md'}" in capsys.readouterr().out
    _assert_report(tmp_path / "run", cover_summary)


def test_report_with_a_decisions_file_and_another_folder(covered, tmp_path):
    _, out, _ = covered
    path = tmp_path / "run" / "summary.json"
    cover_summary = _report_summary(covered, path)
    summary = json.loads(path.read_text())
    del summary["run"]  # the store is not needed when --decisions names the file
    path.write_text(json.dumps(summary))
    assert main(["report", "--summary", str(path), "--decisions", str(out / "decisions.parquet"),
                 "--out", str(tmp_path / "elsewhere")]) == 0
    _assert_report(tmp_path / "elsewhere", cover_summary)
    decisions = pd.read_parquet(out / "decisions.parquet")
    assert len(decisions) == cover_summary["cover"]["candidates"] + int(decisions["skipped_empty"].sum())
