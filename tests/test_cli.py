"""`race validate` and `race cover` end to end on real files, model and Parquet."""

import json

import pandas as pd

from flows.cli import main


def test_validate_prints_counts_and_each_reject(tmp_path, capsys):
    path = tmp_path / "in.jsonl"
    good = {"question": "Compute 1 + 1.", "environment": "calc", "source_revision": "r", "split": "train",
            "successful": True, "turns": [{"reasoning": "r", "action": "finish[2]", "observation": ""}]}
    path.write_text(json.dumps(good) + "\n" + json.dumps({**good, "split": "test"}) + "\n")
    assert main(["validate", "--input", str(path)]) == 1
    out = capsys.readouterr().out
    assert "valid trajectories: 1" in out and "rejected lines: 1" in out
    assert f"{path}:2: [bad_split] split" in out


def test_cover_writes_parquet_and_a_rerun_is_cached(tmp_path, tiny_checkpoint, capsys):
    args = ["cover", "--checkpoint", str(tiny_checkpoint), "--out", str(tmp_path / "out"),
            "--home", str(tmp_path / "home"), "--epsilon", "0.002"]
    assert main(args) == 0
    first = json.loads(capsys.readouterr().out)
    decisions = pd.read_parquet(tmp_path / "out" / "decisions.parquet")
    compressed = pd.read_parquet(tmp_path / "out" / "compressed.parquet")
    assert len(compressed) == first["trajectories"]["ingested"] > 0
    assert first["cover"]["removed"] == int(decisions["accepted"].sum())
    assert first["cover"]["reasoning_tokens_after"] <= first["cover"]["reasoning_tokens_before"]
    assert (decisions["epsilon"] == 0.002).all() and (decisions["turn"] >= 1).all()
    assert not any(s["cached"] for s in first["stages"].values())
    assert main(args) == 0
    second = json.loads(capsys.readouterr().out)
    assert all(s["cached"] for s in second["stages"].values())
    assert second["cover"] == first["cover"]


def test_a_command_without_a_flow_prints_its_log_lines_on_stderr_once_as_bare_messages(tmp_path, tiny_checkpoint,
                                                                                        demo_inputs):
    """`race cover` runs no Prefect flow: the stages' log lines are the plain messages on stderr, each
    once (not also through Prefect's console handler), and stdout is the summary alone. A fresh
    process, as a user's shell starts it (none of Prefect's logging variables set)."""
    import os
    import subprocess
    import sys

    env = {k: v for k, v in os.environ.items() if not k.startswith("PREFECT_LOGGING_")}
    out = tmp_path / "out"
    run = subprocess.run([sys.executable, "-m", "flows.cli", "cover", "--input", *demo_inputs, "--checkpoint",
                          str(tiny_checkpoint), "--out", str(out), "--store", str(tmp_path / "store"), "--home",
                          str(tmp_path / "home")], env=env, capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stderr[-3000:]
    assert json.loads(run.stdout)["trajectories"]["ingested"] == 8
    lines = run.stderr.splitlines()
    assert lines.count("ingest: 8 records = 8 trajectories + 0 rejected lines + 0 duplicates (merged) from 1 file(s)") == 1
    assert lines.count(f"report: {out / 'report.html'} (report.md, plots and summary.json beside it)") == 1
    assert sum(line.startswith("cover: 1 shard(s) of up to ") for line in lines) == 1
    assert not any(" | INFO " in line for line in lines), run.stderr[-3000:]  # not Prefect's console format too


def test_cover_names_a_missing_input_file(tmp_path, capsys):
    assert main(["cover", "--input", str(tmp_path / "nope.jsonl"), "--out", str(tmp_path / "o"),
                 "--home", str(tmp_path / "h")]) == 2
    assert "nope.jsonl" in capsys.readouterr().err


def test_the_command_lines_prefect_defaults_reach_prefect_unless_the_user_set_them():
    """Prefect reads its settings when imported (and `flows.cli` imports it): a default set later
    is silently ignored, and `race demo` on a loaded machine gave up on its temporary server after
    Prefect's 20 s. A fresh process without the variables, then one with the user's own value."""
    import os
    import subprocess
    import sys

    read = ("import flows.cli\nfrom prefect.settings import PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS as T, "
            "PREFECT_SERVER_ANALYTICS_ENABLED as A\nprint(T.value(), A.value())")
    env = {k: v for k, v in os.environ.items() if k not in ("PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS",
                                                            "PREFECT_SERVER_ANALYTICS_ENABLED")}
    out = subprocess.run([sys.executable, "-c", read], env=env, capture_output=True, text=True, check=True).stdout
    assert out.split() == ["180", "False"]
    env["PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS"] = "7"
    out = subprocess.run([sys.executable, "-c", read], env=env, capture_output=True, text=True, check=True).stdout
    assert out.split() == ["7", "False"]


def test_each_command_shows_only_the_options_its_stages_read():
    """`race cover` runs no training stage: the training resources are not its options (argparse rejects
    them); `race run` trains and takes them. Both keep every other resources option."""
    import dataclasses

    import pytest

    from flows.cli import build_parser
    from race_core.config import Resources

    parser = build_parser()
    commands = {action.dest: action for action in parser._subparsers._group_actions}["command"].choices
    cover, run = commands["cover"].format_help(), commands["run"].format_help()
    training = [f"--{name.replace('_', '-')}" for name in Resources.TRAINING]
    assert training and all(flag not in cover for flag in training) and all(flag in run for flag in training)
    others = [f"--{f.name.replace('_', '-')}" for f in dataclasses.fields(Resources) if f.name not in Resources.TRAINING]
    assert all(flag in cover and flag in run for flag in others)
    with pytest.raises(SystemExit):
        parser.parse_args(["cover", "--out", "o", "--train-processes", "2"])


def test_a_bench_stopped_by_sigterm_runs_its_exit_handlers():
    """`race bench` turns SIGTERM into an exit (`flows.cli._exit_on_sigterm`): atexit handlers run, which
    is how a vLLM engine shuts down the processes it started (killed with the default action, a bench
    left its EngineCore and Worker running, reparented to init). The handler here stands in for vLLM's."""
    import signal
    import subprocess
    import sys

    child = subprocess.Popen([sys.executable, "-c", (
        "import atexit, sys, time\n"
        "from flows.cli import _exit_on_sigterm\n"
        "_exit_on_sigterm()\n"
        "atexit.register(lambda: print('shut down', flush=True))\n"
        "print('ready', flush=True)\n"
        "time.sleep(120)\n")], stdout=subprocess.PIPE, text=True)
    assert child.stdout.readline().strip() == "ready"
    child.send_signal(signal.SIGTERM)
    out, _ = child.communicate(timeout=60)
    assert child.returncode == 128 + signal.SIGTERM and out.strip() == "shut down"
