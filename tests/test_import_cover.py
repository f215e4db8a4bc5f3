"""Agent logs in every importer format, imported and covered on a real instruct checkpoint whose
template renders tool calls (SmolLM2 with ChatML + Hermes tool calls): the tool-call turns are
scored on the template's own tool-call tokens, `race cover --format` reads the raw logs to the same
trajectories as `race import` then `race cover`. (hf and vllm-cpu deciding alike is
tests/test_smollm2_cover.py's, on the same weights: both backends render through `Renderer` over the
checkpoint's own tokenizer, so a tool-call turn reaches either as the same token ids.)"""

import contextlib
import io
import json

import pandas as pd
import pytest

from flows.cli import main

EPSILON = 0.3  # SmolLM2's largest drops on these logs: mixed decisions at this ε (checked below)

WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "Weather forecast for a city.",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}, "day": {"type": "string"}},
                   "required": ["city"]}}}
CONVERT = {"type": "function", "function": {
    "name": "to_fahrenheit", "description": "Convert Celsius to Fahrenheit.",
    "parameters": {"type": "object", "properties": {"celsius": {"type": "number"}}, "required": ["celsius"]}}}


def _call(call_id, name, arguments):
    return {"id": call_id, "type": "function", "function": {"name": name, "arguments": json.dumps(arguments)}}


OPENAI = {"messages": [
    {"role": "system", "content": "You are a travel assistant. Use the tools."},
    {"role": "user", "content": "What will the weather be in Paris and in Rome tomorrow?"},
    {"role": "assistant", "content": "", "reasoning_content": "I need both cities; I can ask for them at once.",
     "tool_calls": [_call("call_p", "get_weather", {"city": "Paris", "day": "tomorrow"}),
                    _call("call_r", "get_weather", {"city": "Rome", "day": "tomorrow"})]},
    {"role": "tool", "tool_call_id": "call_r", "content": "Rome: 18 C, sunny"},
    {"role": "tool", "tool_call_id": "call_p", "content": "Paris: 12 C, rain"},
    {"role": "assistant", "content": "<think>The user may prefer Fahrenheit. Convert Paris first.</think>",
     "tool_calls": [_call("call_c", "to_fahrenheit", {"celsius": 12})]},
    {"role": "tool", "tool_call_id": "call_c", "content": "53.6"},
    {"role": "assistant", "content": "<think>I have everything I need.</think>"
                                     "Paris: 12 C (53.6 F) with rain; Rome: 18 C and sunny."},
], "tools": [WEATHER, CONVERT], "successful": True, "id": "chat-001"}

SHAREGPT = {"conversations": [
    {"from": "human", "value": "Is it warmer in Oslo or in Madrid today?"},
    {"from": "gpt", "value": "I will look up Oslo first."},
    {"from": "function_call", "value": json.dumps({"name": "get_weather", "arguments": {"city": "Oslo"}})},
    {"from": "observation", "value": "Oslo: 3 C, snow"},
    {"from": "function_call", "value": "<think>Now Madrid, to compare.</think>"
                                       + json.dumps({"name": "get_weather", "arguments": {"city": "Madrid"}})},
    {"from": "observation", "value": "Madrid: 21 C, clear"},
    {"from": "gpt", "value": "<think>21 is more than 3.</think>Madrid is warmer (21 C against 3 C)."},
], "system": "You compare weather with tools.", "tools": json.dumps([WEATHER]), "reward": 1.0}

SWE_AGENT = {"trajectory": [
    {"thought": "Let me see the repository layout first.", "action": "ls", "observation": "setup.py\nsrc\ntests"},
    {"thought": "The bug is in the parser; open it.", "action": "open src/parser.py",
     "observation": "1: def parse(text):\n2:     return text.split(',')"},
    {"thought": "Strip spaces around the fields, then submit.",
     "action": "edit 2:2\n    return [f.strip() for f in text.split(',')]\nend_of_edit",
     "observation": "File updated."},
    {"thought": "Done.", "action": "submit", "observation": ""},
], "history": [{"role": "system", "content": "You are an autonomous programmer."},
               {"role": "user", "content": "Fix: parse('a, b') returns ['a', ' b'] instead of ['a', 'b']."}],
    "info": {"exit_status": "submitted"}}

REACT = {"question": "Who directed the film in which Tom Hanks plays a man stranded on an island?",
         "text": "Thought: The film is Cast Away. I need its director.\n"
                 "Action: Search\nAction Input: {\"query\": \"Cast Away director\"}\n"
                 "Observation: Cast Away (2000) was directed by Robert Zemeckis.\n"
                 "Thought: Check that it is the island film.\nAction: Lookup[island]\n"
                 "Observation: Chuck Noland is stranded on an uninhabited island.\n"
                 "Thought: Confirmed.\nFinal Answer: Robert Zemeckis",
         "successful": True}


@pytest.fixture(scope="module")
def logs(tmp_path_factory):
    folder = tmp_path_factory.mktemp("logs")
    files = {"openai": folder / "chat.jsonl", "sharegpt": folder / "sharegpt.json",
             "swe-agent": folder / "django__django-1.traj", "react": folder / "react.jsonl"}
    files["openai"].write_text(json.dumps(OPENAI) + "\n" + json.dumps({**OPENAI, "successful": False}) + "\n")
    files["sharegpt"].write_text(json.dumps([SHAREGPT]))
    files["swe-agent"].write_text(json.dumps(SWE_AGENT))
    files["react"].write_text(json.dumps(REACT) + "\n")
    imported = {}
    for name, path in files.items():
        out = folder / f"{name}.imported.jsonl"
        assert main(["import", "--format", name, "--input", str(path), "--out", str(out)]) == 0
        imported[name] = out
    return files, imported


def cover(args, out, store, capsys):
    assert main(["cover", *args, "--out", str(out), "--store", str(store), "--epsilon", str(EPSILON)]) == 0
    summary = json.loads(capsys.readouterr().out)
    return summary, {name: pd.read_parquet(out / f"{name}.parquet") for name in ("decisions", "compressed")}


def decided(frame):
    return frame.sort_values(["trajectory_id", "turn"]).reset_index(drop=True)


@pytest.fixture(scope="module")
def hf_run(logs, smollm2_tools_checkpoint, tmp_path_factory):
    _, imported = logs
    root = tmp_path_factory.mktemp("hf")
    printed = io.StringIO()  # module scope: no capsys
    with contextlib.redirect_stdout(printed):
        assert main(["cover", "--input", *map(str, imported.values()), "--checkpoint", str(smollm2_tools_checkpoint),
                     "--out", str(root / "out"), "--store", str(root / "store"), "--epsilon", str(EPSILON)]) == 0
    summary = json.loads(printed.getvalue())
    return summary, {name: pd.read_parquet(root / "out" / f"{name}.parquet") for name in ("decisions", "compressed")}


def test_every_format_is_covered_on_the_templates_own_tool_call_tokens(hf_run):
    summary, frames = hf_run
    assert summary["trajectories"]["ingested"] == 4  # one per format; the failed OpenAI record was not imported
    compressed, decisions = frames["compressed"], frames["decisions"]
    by_env = dict(zip(compressed["environment"], compressed["id"], strict=True))
    assert set(by_env) == {"openai", "sharegpt", "swe-agent", "react"}
    modes = decisions.groupby("trajectory_id")["render_mode"].first()
    # tool calls in openai, sharegpt and react (Action Input as JSON); swe-agent's actions are text
    assert {env for env, tid in by_env.items() if modes[tid].endswith("+tools:template")} == {
        "openai", "sharegpt", "react"}
    assert modes[by_env["swe-agent"]] == "canonical/keeps-reasoning"
    scored = decisions[~decisions["skipped_empty"]]
    assert len(scored) >= 6 and 0 < scored["accepted"].sum() < len(scored)  # mixed: the comparisons can fail
    # the parallel call turn's action tokens are both calls' tool-call blocks, far more than a text action's
    openai_turns = decisions[decisions["trajectory_id"] == by_env["openai"]]
    assert openai_turns.set_index("turn")["action_tokens"].min() > 15


def test_cover_with_format_reads_raw_logs_to_the_same_decisions(logs, hf_run, smollm2_tools_checkpoint, tmp_path,
                                                                capsys):
    files, _ = logs
    _, frames = hf_run
    ids = set()
    for name, path in files.items():
        summary, raw = cover(["--format", name, "--input", str(path), "--checkpoint", str(smollm2_tools_checkpoint)],
                             tmp_path / name, tmp_path / "store", capsys)
        if name == "openai":
            assert summary["trajectories"]["rejected"] == 1  # the failed record: a reject row, not lost
        theirs = decided(raw["decisions"])
        ours = decided(frames["decisions"][frames["decisions"]["trajectory_id"].isin(set(theirs["trajectory_id"]))])
        assert len(theirs) > 0 and list(theirs["accepted"]) == list(ours["accepted"])
        assert (theirs["max_drop"] - ours["max_drop"]).abs().max() < 1e-5
        ids |= set(theirs["trajectory_id"])
    assert ids == set(frames["decisions"]["trajectory_id"])
