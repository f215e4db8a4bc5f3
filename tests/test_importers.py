"""Agent-log importers (issue 14): small files in each format checked field by field, every kind of
bad record skipped with its reason while the good ones are kept, streaming reads, `race import`,
and the pipeline reading the logs directly (`race cover --format openai`, the nightly inbox)."""

from __future__ import annotations

import gzip
import io
import json
from pathlib import Path

import pandas as pd
import pytest

from flows.cli import main
from race_core.importers import ImportOptions, ImportStats, import_stream, reader
from race_core.schema import Reject, Trajectory, read_jsonl


def imported(path: Path, fmt: str, **options) -> tuple[list[dict], list[tuple[int, str, str]], ImportStats]:
    """(each trajectory's contract dict, each skip as (line, code, field), the counts) of one file."""
    stats = ImportStats()
    good, skipped = [], []
    with open(path, "rb") as fh:
        for item in import_stream(fh, str(path), fmt, ImportOptions(**options), stats=stats):
            if isinstance(item, Reject):
                assert item.file == str(path) and item.message
                skipped.append((item.line, item.code, item.field))
            else:
                good.append(item.to_dict())
    return good, skipped, stats


def jsonl(path: Path, records: list) -> Path:
    path.write_text("".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in records))
    return path


def call(call_id: str, name: str, arguments) -> dict:
    return {"id": call_id, "type": "function", "function": {"name": name, "arguments": arguments}}


WEATHER_TOOLS = [{"type": "function", "function": {"name": "get_weather", "description": "Weather of a city",
                                                   "parameters": {"type": "object",
                                                                  "properties": {"city": {"type": "string"}}}}}]


def openai_record(n: int = 1, **changes) -> dict:
    record = {
        "id": f"chatcmpl-{n}", "successful": True, "metadata": {"agent": "demo"}, "tools": WEATHER_TOOLS,
        "messages": [
            {"role": "system", "content": "You are a weather agent."},
            {"role": "user", "content": f"Weather in Paris and Rome? ({n})"},
            {"role": "assistant", "content": "Checking both.", "reasoning_content": "Two cities, two calls.",
             "tool_calls": [call("c1", "get_weather", '{"city": "Paris"}'),
                            call("c2", "get_weather", '{"city": "Rome"}')]},
            {"role": "tool", "tool_call_id": "c2", "content": "Rome: 20C"},  # answered out of call order
            {"role": "tool", "tool_call_id": "c1", "content": "Paris: 15C"},
            {"role": "assistant", "content": "<think>\nCompare them.\n</think>\n",
             "tool_calls": [call("c3", "compare", '{"a": 15, "b": 20}')]},
            {"role": "tool", "tool_call_id": "c3", "content": [{"type": "text", "text": "-5"}]},
            {"role": "user", "content": "One line, please."},
            {"role": "assistant", "content": "Rome is warmer.</think>\n\nParis 15C, Rome 20C."},
        ],
    }
    record.update(changes)
    return record


def with_message(index: int, message: dict | None, **changes) -> dict:
    """openai_record() with message `index` replaced (None: removed)."""
    messages = list(openai_record()["messages"])
    if message is None:
        del messages[index]
    else:
        messages[index] = message
    return openai_record(messages=messages, **changes)


# -- OpenAI ------------------------------------------------------------------------------------
def test_openai_record_becomes_the_contract_field_by_field(tmp_path):
    path = jsonl(tmp_path / "chat.jsonl", [openai_record()])
    good, skipped, stats = imported(path, "openai")
    assert skipped == [] and stats.imported == 1 and stats.assumed_successful == 0
    [t] = good
    assert t["question"] == "Weather in Paris and Rome? (1)"
    assert t["system"] == "You are a weather agent."
    assert t["tools"] == WEATHER_TOOLS
    assert (t["environment"], t["source_revision"], t["split"], t["successful"]) == ("openai", "unknown", "train", True)
    first, second, last = t["turns"]
    # parallel calls: one turn, the calls in call order, their results joined in call order
    assert first == {"reasoning": "Two cities, two calls.\n\nChecking both.",
                     "action": [{"name": "get_weather", "arguments": {"city": "Paris"}, "id": "c1"},
                                {"name": "get_weather", "arguments": {"city": "Rome"}, "id": "c2"}],
                     "observation": "Paris: 15C\n\nRome: 20C"}
    assert second == {"reasoning": "Compare them.", "action": {"name": "compare", "arguments": {"a": 15, "b": 20},
                                                                "id": "c3"},
                      "observation": "-5\n\nOne line, please."}  # the user's text after the result joins it
    assert last == {"reasoning": "Rome is warmer.", "action": "Paris 15C, Rome 20C.", "observation": ""}
    assert t["source_id"] == "chatcmpl-1" and t["metadata"] == {"agent": "demo"}
    assert (t["source_format"], t["source_file"], t["source_line"]) == ("openai", str(path), 1)
    assert Trajectory.from_dict(t).to_dict() == t  # the contract reads it back unchanged


def test_openai_environment_revision_and_legacy_function_calls(tmp_path):
    legacy = {"reward": 1, "environment": "weather-v2", "functions": [{"name": "get_weather", "parameters": {}}],
              "messages": [{"role": "user", "content": "Paris?"},
                           {"role": "assistant", "content": None,
                            "function_call": {"name": "get_weather", "arguments": '{"city": "Paris"}'}},
                           {"role": "function", "name": "get_weather", "content": "15C"},
                           {"role": "assistant", "content": "15C.", "reasoning": "It said 15C."}]}
    path = jsonl(tmp_path / "legacy.jsonl", [legacy])
    [t], skipped, _ = imported(path, "openai", environment="ignored", source_revision="agent@abc123")
    assert skipped == []
    assert (t["environment"], t["source_revision"]) == ("weather-v2", "agent@abc123")  # the record's own first
    assert t["tools"] == [{"name": "get_weather", "parameters": {}}]
    assert t["turns"] == [{"reasoning": "", "action": {"name": "get_weather", "arguments": {"city": "Paris"}},
                           "observation": "15C"},
                          {"reasoning": "It said 15C.", "action": "15C.", "observation": ""}]


def test_openai_bad_records_are_skipped_with_their_reason_and_the_good_ones_kept(tmp_path):
    tool_call_at = "messages[2].tool_calls[0].function"
    assistant = openai_record()["messages"][2]
    records = [
        openai_record(1),
        with_message(2, {**assistant, "tool_calls": [call("c1", "get_weather", '{"city": '),
                                                     call("c2", "get_weather", "{}")]}),
        with_message(2, {**assistant, "tool_calls": [call("c1", "get_weather", "[1, 2]"),
                                                     call("c2", "get_weather", "{}")]}),
        with_message(2, {**assistant, "tool_calls": [call("c1", "", "{}"), call("c2", "get_weather", "{}")]}),
        with_message(3, {"role": "tool", "tool_call_id": "c9", "content": "?"}),
        with_message(4, None),  # c1's result is lost before the next assistant message
        openai_record(messages=[m for m in openai_record()["messages"] if m["role"] != "user"]),
        openai_record(messages=openai_record()["messages"][:2]),
        openai_record(successful=False),
        {k: v for k, v in openai_record().items() if k != "successful"},
        with_message(1, {"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}),
        '{"messages": [',
        '"a string"',
        openai_record(successful=None, reward=0.5),
        openai_record(split="test"),
        with_message(8, {"role": "assistant", "content": "<think>no answer</think>"}),
        openai_record(successful="yes"),
        openai_record(17),
    ]
    good, skipped, stats = imported(jsonl(tmp_path / "mixed.jsonl", records), "openai")
    assert [t["source_id"] for t in good] == ["chatcmpl-1", "chatcmpl-17"]
    assert skipped == [
        (2, "malformed_call", f"{tool_call_at}.arguments"),
        (3, "malformed_call", f"{tool_call_at}.arguments"),
        (4, "malformed_call", f"{tool_call_at}.name"),
        (5, "orphan_observation", "messages[3].tool_call_id"),
        (6, "missing_observation", "messages[2]"),
        (7, "no_question", "messages"),
        (8, "no_turns", "messages"),
        (9, "not_successful", "successful"),
        (10, "no_success_flag", "<record>"),
        (11, "malformed_message", "messages[1].content[0]"),
        (12, "not_json", "<record>"),
        (13, "not_object", "<record>"),
        (14, "not_successful", "reward"),
        (15, "bad_split", "split"),
        (16, "empty_action", "messages[8]"),
        (17, "bad_success_flag", "successful"),
    ]
    assert stats.imported == 2 and sum(stats.skipped.values()) == 16


def test_assume_successful_takes_records_without_a_flag_but_never_a_failed_one(tmp_path):
    unflagged = {k: v for k, v in openai_record().items() if k != "successful"}
    path = jsonl(tmp_path / "chat.jsonl", [unflagged, openai_record(successful=False)])
    good, skipped, stats = imported(path, "openai", assume_successful=True)
    assert len(good) == 1 and skipped == [(2, "not_successful", "successful")]
    assert stats.assumed_successful == 1


# -- ShareGPT / LLaMA-Factory --------------------------------------------------------------------
CALC_TOOLS = [{"name": "calc", "description": "Evaluate an expression",
               "parameters": {"type": "object", "properties": {"expr": {"type": "string"}}}}]


def sharegpt_record(**changes) -> dict:
    record = {
        "conversations": [
            {"from": "human", "value": "What is (2 + 3) * 4?"},
            {"from": "gpt", "value": "Add first."},
            {"from": "function_call", "value": '{"name": "calc", "arguments": {"expr": "2+3"}}'},
            {"from": "observation", "value": "5"},
            {"from": "function_call",
             "value": '<think>Multiply, and log it.</think>[{"name": "calc", "arguments": "{\\"expr\\": \\"5*4\\"}"}, '
                      '{"name": "log", "arguments": {}}]'},
            {"from": "observation", "value": "20"},
            {"from": "observation", "value": "logged"},
            {"from": "gpt", "value": "<think>Done.</think>The answer is 20."},
        ],
        "system": "Be exact.", "tools": json.dumps(CALC_TOOLS), "success": True, "id": "sg-1",
    }
    record.update(changes)
    return record


def test_sharegpt_record_becomes_the_contract_field_by_field(tmp_path):
    role_content = {"messages": [{"role": "system", "content": "Short answers."},
                                 {"role": "user", "content": "Hi?"}, {"role": "assistant", "content": "Hello."}],
                    "tools": CALC_TOOLS, "success": True}
    good, skipped, _ = imported(jsonl(tmp_path / "sg.jsonl", [sharegpt_record(), role_content]), "sharegpt")
    assert skipped == []
    first, second = good
    assert (first["question"], first["system"], first["tools"]) == ("What is (2 + 3) * 4?", "Be exact.", CALC_TOOLS)
    assert first["turns"] == [
        {"reasoning": "Add first.", "action": {"name": "calc", "arguments": {"expr": "2+3"}}, "observation": "5"},
        {"reasoning": "Multiply, and log it.",
         "action": [{"name": "calc", "arguments": {"expr": "5*4"}}, {"name": "log", "arguments": {}}],
         "observation": "20\n\nlogged"},
        {"reasoning": "Done.", "action": "The answer is 20.", "observation": ""},
    ]
    assert first["source_id"] == "sg-1" and first["environment"] == "sharegpt"
    assert (second["question"], second["system"], second["tools"]) == ("Hi?", "Short answers.", CALC_TOOLS)
    assert second["turns"] == [{"reasoning": "", "action": "Hello.", "observation": ""}]


def test_sharegpt_bad_records_are_skipped_with_their_reason(tmp_path):
    entries = sharegpt_record()["conversations"]

    def with_entry(index, entry, **changes):
        changed = list(entries)
        if entry is None:
            del changed[index]
        else:
            changed[index] = entry
        return sharegpt_record(conversations=changed, **changes)

    records = [
        sharegpt_record(),
        with_entry(2, {"from": "function_call", "value": "calc(2+3)"}),
        with_entry(2, {"from": "function_call", "value": '{"name": "calc", "arguments": "[1]"}'}),
        with_entry(1, {"from": "observation", "value": "5"}),
        with_entry(1, {"from": "robot", "value": "beep"}),
        sharegpt_record(tools="[{not json"),
        with_entry(3, None),  # the first call's observation is lost
        sharegpt_record(conversations=entries[1:]),
        sharegpt_record(success=False),
    ]
    good, skipped, _ = imported(jsonl(tmp_path / "sg.jsonl", records), "sharegpt")
    assert len(good) == 1 and good[0]["source_line"] == 1
    assert skipped == [
        (2, "malformed_call", "conversations[2].value"),
        (3, "malformed_call", "conversations[2].value.arguments"),
        (4, "orphan_observation", "conversations[1]"),
        (5, "malformed_message", "conversations[1].from"),
        (6, "bad_tools", "tools"),
        (7, "missing_observation", "conversations[2]"),
        (8, "no_question", "conversations"),
        (9, "not_successful", "success"),
    ]


# -- SWE-agent ---------------------------------------------------------------------------------
def swe_traj(**changes) -> dict:
    traj = {
        "environment": "swe_main",
        "trajectory": [
            {"thought": "Find the file.\n", "action": "find_file forms.py\n", "observation": "Found 1 match\n",
             "response": "DISCUSSION ...", "state": "{}"},
            {"thought": "Fix the bound.", "action": "edit 10:10\n    return x <= y\nend_of_edit",
             "observation": "File updated."},
            {"thought": None, "action": "submit", "observation": "diff --git a/forms.py b/forms.py"},
        ],
        "history": [
            {"role": "system", "content": "SETTING: you are an autonomous programmer.", "agent": "primary"},
            {"role": "user", "content": "Here is a demonstration ...", "is_demo": True},
            {"role": "user", "content": [{"type": "text", "text": "ISSUE: forms reject equal bounds."}]},
            {"role": "assistant", "content": "Find the file."},
        ],
        "info": {"exit_status": "submitted", "submission": "diff --git a/forms.py b/forms.py",
                 "model_stats": {"tokens_sent": 100}},
        "replay_config": '{"agent": {}}',
    }
    traj.update(changes)
    return traj


def write_traj(path: Path, traj: dict) -> Path:
    path.write_text(json.dumps(traj, indent=2))  # SWE-agent writes indented JSON, one document per file
    return path


def test_swe_agent_traj_becomes_the_contract_field_by_field(tmp_path):
    path = write_traj(tmp_path / "django__django-11099.traj", swe_traj())
    [t], skipped, _ = imported(path, "swe-agent")
    assert skipped == []
    assert t["question"] == "ISSUE: forms reject equal bounds."  # the demonstration is passed over
    assert t["system"] == "SETTING: you are an autonomous programmer."
    assert t["environment"] == "swe_main" and "tools" not in t
    assert t["turns"] == [
        {"reasoning": "Find the file.", "action": "find_file forms.py", "observation": "Found 1 match\n"},
        {"reasoning": "Fix the bound.", "action": "edit 10:10\n    return x <= y\nend_of_edit",
         "observation": "File updated."},
        {"reasoning": "", "action": "submit", "observation": "diff --git a/forms.py b/forms.py"},
    ]
    assert (t["instance_id"], t["exit_status"], t["source_line"]) == ("django__django-11099", "submitted", 1)
    # what the contract has no field for is kept: the patch, the model stats, the config, the steps' other fields
    assert (t["submission"], t["model_stats"], t["replay_config"]) == (
        "diff --git a/forms.py b/forms.py", {"tokens_sent": 100}, '{"agent": {}}')
    assert t["steps"] == [{"response": "DISCUSSION ...", "state": "{}"}, {}, {}]
    assert not {"history", "trajectory", "info", "tool_config"} & set(t)


def test_swe_agent_bad_trajectories_are_skipped_with_their_reason(tmp_path):
    steps = swe_traj()["trajectory"]
    cases = {
        "autosubmitted": (swe_traj(info={"exit_status": "submitted (exit_cost)"}), "not_successful",
                          "info.exit_status"),
        "no-status": (swe_traj(info={}), "no_success_flag", "<record>"),
        "no-command": (swe_traj(trajectory=[steps[0], {**steps[1], "action": ""}]), "empty_action",
                       "trajectory[1].action"),
        "no-issue": (swe_traj(history=[{"role": "system", "content": "s"}]), "no_question", "history"),
        "no-steps": (swe_traj(trajectory=[]), "no_turns", "trajectory"),
        "bad-thought": (swe_traj(trajectory=[{**steps[0], "thought": 5}]), "malformed_message",
                        "trajectory[0].thought"),
    }
    for name, (traj, code, field) in cases.items():
        good, skipped, _ = imported(write_traj(tmp_path / f"{name}.traj", traj), "swe-agent")
        assert (good, skipped) == ([], [(1, code, field)]), name
    good, skipped, stats = imported(tmp_path / "no-status.traj", "swe-agent", assume_successful=True)
    assert len(good) == 1 and skipped == [] and stats.assumed_successful == 1


# -- ReAct text --------------------------------------------------------------------------------
LANGCHAIN_TEXT = ("I should look up the weather.\n"
                  "Action: get_weather\nAction Input: {\"city\": \"Paris\"}\nObservation: 15C, sunny\n"
                  "Thought: Note it down.\nAction: notepad\nAction Input: Paris is sunny\nObservation: saved\n"
                  "Thought: I now know the final answer.\nFinal Answer: 15C and sunny")
PAPER_TEXT = ("Solve a question answering task with interleaving Thought, Action, Observation steps.\n"
              "Question: Which city is the capital of France?\n"
              "Thought 1: I need to search France.\nAction 1: Search[France]\n"
              "Observation 1: France ... its capital is Paris.\n"
              "Thought 2: The capital is Paris.\nAction 2: Finish[Paris]")


def test_react_text_becomes_the_contract_field_by_field(tmp_path):
    records = [{"question": "Weather in Paris?", "text": LANGCHAIN_TEXT, "successful": True},
               {"trajectory": PAPER_TEXT, "reward": 1.0, "task_id": 7}]
    good, skipped, _ = imported(jsonl(tmp_path / "react.jsonl", records), "react")
    assert skipped == []
    langchain, paper = good
    assert langchain["question"] == "Weather in Paris?" and "system" not in langchain
    assert langchain["turns"] == [
        {"reasoning": "I should look up the weather.", "action": {"name": "get_weather", "arguments": {"city": "Paris"}},
         "observation": "15C, sunny"},
        {"reasoning": "Note it down.", "action": "notepad\nAction Input: Paris is sunny", "observation": "saved"},
        {"reasoning": "I now know the final answer.", "action": "Final Answer: 15C and sunny", "observation": ""},
    ]
    assert paper["question"] == "Which city is the capital of France?"
    assert paper["system"].startswith("Solve a question answering task")
    assert paper["turns"] == [
        {"reasoning": "I need to search France.", "action": "Search[France]",
         "observation": "France ... its capital is Paris."},
        {"reasoning": "The capital is Paris.", "action": "Finish[Paris]", "observation": ""},
    ]
    assert paper["task_id"] == 7 and paper["environment"] == "react"


def test_react_bad_records_are_skipped_with_their_reason(tmp_path):
    def record(text, **changes):
        return {"question": "q?", "text": text, "successful": True, **changes}

    records = [
        record("Observation: early\nAction: a"),
        record("Action: a\nAction: b"),
        record("Action: a\nObservation: o\nThought: and then?"),
        record("Thought: t\nAction Input: {}"),
        {"text": "Action: a", "successful": True},
        record("Thought: just thinking"),
        record(["not", "text"]),
        record("Thought: t\nAction: search\nAction Input: {\"q\": 1}\nObservation: found\nFinal Answer: 1"),
    ]
    good, skipped, _ = imported(jsonl(tmp_path / "react.jsonl", records), "react")
    assert [t["source_line"] for t in good] == [8]
    assert skipped == [
        (1, "orphan_observation", "text: block 1 (Observation)"),
        (2, "missing_observation", "text: block 2 (Action)"),
        (3, "empty_action", "text: end"),
        (4, "malformed_call", "text: block 2 (Action Input)"),
        (5, "no_question", "question"),
        (6, "empty_action", "text: end"),
        (7, "wrong_type", "text"),
    ]


# -- reading files -----------------------------------------------------------------------------
def test_jsonl_a_json_array_concatenated_documents_and_gzip_read_alike(tmp_path):
    records = [openai_record(n) for n in range(1, 4)]
    files = {"lines.jsonl": "".join(json.dumps(r) + "\n" for r in records).encode(),
             "array.json": json.dumps(records, indent=2).encode(),
             "documents.json": "\n".join(json.dumps(r, indent=1) for r in records).encode(),
             "lines.jsonl.gz": gzip.compress("".join(json.dumps(r) + "\n" for r in records).encode())}
    seen = {}
    for name, data in files.items():
        (tmp_path / name).write_bytes(data)
        good, skipped, _ = imported(tmp_path / name, "openai")
        assert skipped == [], name
        seen[name] = [Trajectory.from_dict(t).id for t in good]
        starts = [t["source_line"] for t in good]
        assert starts == sorted(starts) and len(set(starts)) == 3, name  # each record: the line it starts on
    assert len(set(map(tuple, seen.values()))) == 1 and len(seen["lines.jsonl"]) == 3


def test_a_bad_or_over_long_record_costs_that_record_only_at_any_chunk_size(tmp_path, monkeypatch):
    big = openai_record(3, metadata={"padding": "x" * 5000})
    lines = [openai_record(1), '{"messages": [}', json.dumps(big), '{"truncated": "', openai_record(5)]
    path = jsonl(tmp_path / "mixed.jsonl", lines)
    expected = [(2, "not_json"), (3, "line_too_long"), (4, "not_json")]

    def read() -> tuple[list, list]:
        with open(path, "rb") as fh:
            items = list(import_stream(fh, "f", "openai", limits=reader_limits(4000)))
        return ([t.question for t in items if isinstance(t, Trajectory)],
                [(r.line, r.code) for r in items if isinstance(r, Reject)])

    whole = read()
    assert whole == (["Weather in Paris and Rome? (1)", "Weather in Paris and Rome? (5)"], expected)
    for chunk in (1, 3, 7, 64):  # every token and escape cut somewhere by a chunk boundary
        monkeypatch.setattr(reader, "READ_CHUNK_BYTES", chunk)
        assert read() == whole, chunk


def reader_limits(max_line_bytes: int):
    from race_core.schema import Limits

    return Limits(max_line_bytes=max_line_bytes)


def test_records_are_yielded_as_they_are_read(tmp_path, monkeypatch):
    class Counting(io.BytesIO):
        """A real byte stream that remembers how far it was read."""

        def read1(self, size: int = -1, /) -> bytes:
            return self.read(size)

    monkeypatch.setattr(reader, "READ_CHUNK_BYTES", 4096)  # the default (1 MiB) would take this file in one read
    data = "".join(json.dumps(openai_record(n)) + "\n" for n in range(200)).encode()
    stream = Counting(data)
    items = import_stream(stream, "f", "openai")
    assert isinstance(next(items), Trajectory)
    assert stream.tell() <= 2 * 4096 < len(data)  # the first trajectory came before the rest was read
    assert sum(1 for _ in items) == 199 and stream.tell() == len(data)


# -- race import -------------------------------------------------------------------------------
def test_race_import_writes_contract_lines_lists_each_skip_and_a_summary(tmp_path, capsys):
    logs = jsonl(tmp_path / "chat.jsonl", [openai_record(1), openai_record(2, successful=False),
                                           {k: v for k, v in openai_record(3).items() if k != "successful"}])
    out = tmp_path / "out" / "trajectories.jsonl"
    assert main(["import", "--format", "openai", "--input", str(logs), "--out", str(out)]) == 0
    err = capsys.readouterr().err
    assert f"{logs}:2: [not_successful] successful: the record did not succeed" in err
    assert f"{logs}:3: [no_success_flag] <record>: no success flag" in err
    assert "1 trajectories written" in err and "2 record(s) skipped (" in err
    assert "no_success_flag 1" in err and "not_successful 1" in err
    assert not out.with_name(out.name + ".partial").exists()
    trajectories, rejects = read_jsonl([out])  # every imported line is a valid contract line
    assert rejects == [] and [t.question for t in trajectories] == ["Weather in Paris and Rome? (1)"]

    assert main(["import", "--format", "openai", "--input", str(logs), "--out", str(out),
                 "--assume-successful", "--source-revision", "agent@1"]) == 0
    err = capsys.readouterr().err
    assert "warning: 1 of the trajectories written carry no success flag and were taken as successful" in err
    trajectories, rejects = read_jsonl([out])
    assert rejects == [] and len(trajectories) == 2
    assert {t.source_revision for t in trajectories} == {"agent@1"}


def test_race_validate_checks_agent_logs_as_the_import_reads_them(tmp_path, capsys):
    logs = jsonl(tmp_path / "chat.jsonl", [openai_record(1), openai_record(2, successful=False)])
    assert main(["validate", "--format", "openai", "--input", str(logs)]) == 1
    out = capsys.readouterr().out
    assert "valid trajectories: 1" in out and "rejected lines: 1" in out
    assert f"{logs}:2: [not_successful] successful" in out
    assert main(["validate", "--input", str(logs)]) == 1  # the same file read as the contract: not one line valid
    assert "valid trajectories: 0" in capsys.readouterr().out


def test_every_format_imports_to_lines_the_contract_accepts(tmp_path, capsys):
    samples = {
        "openai": jsonl(tmp_path / "chat.jsonl", [openai_record()]),
        "sharegpt": jsonl(tmp_path / "sg.jsonl", [sharegpt_record()]),
        "swe-agent": write_traj(tmp_path / "astropy__astropy-1.traj", swe_traj()),
        "react": jsonl(tmp_path / "react.jsonl", [{"question": "Weather in Paris?", "text": LANGCHAIN_TEXT,
                                                   "successful": True}]),
    }
    for fmt, path in samples.items():
        out = tmp_path / f"{fmt}.out.jsonl"
        assert main(["import", "--format", fmt, "--input", str(path), "--out", str(out)]) == 0, fmt
        lines = out.read_text().splitlines()
        assert len(lines) == 1
        parsed = Trajectory.from_dict(json.loads(lines[0]))
        assert parsed.id == json.loads(lines[0])["id"] and parsed.turns, fmt
    assert main(["import", "--format", "openai", "--input", str(tmp_path / "none.jsonl"), "--out", "-"]) == 2
    assert "none.jsonl" in capsys.readouterr().err


# -- the pipeline reads the logs directly -----------------------------------------------------
def test_race_cover_with_format_openai_ingests_the_logs(tmp_path, tiny_checkpoint, capsys):
    logs = jsonl(tmp_path / "chat.jsonl", [openai_record(1), openai_record(2, successful=False), openai_record(3)])
    out = tmp_path / "out"
    assert main(["cover", "--format", "openai", "--input", str(logs), "--checkpoint", str(tiny_checkpoint),
                 "--out", str(out), "--home", str(tmp_path / "home"), "--store", str(tmp_path / "store")]) == 0
    summary = json.loads(capsys.readouterr().out)
    assert summary["trajectories"]["ingested"] == 2 and summary["trajectories"]["rejected"] == 1
    compressed = pd.read_parquet(out / "compressed.parquet")
    assert sorted(compressed["question"]) == ["Weather in Paris and Rome? (1)", "Weather in Paris and Rome? (3)"]
    row = compressed.iloc[0]
    assert row["system"] == "You are a weather agent." and json.loads(row["tools"]) == WEATHER_TOOLS
    assert json.loads(row["turns"][0]["tool_calls"]) == [
        {"name": "get_weather", "arguments": {"city": "Paris"}, "id": "c1"},
        {"name": "get_weather", "arguments": {"city": "Rome"}, "id": "c2"}]
    rejects = pd.read_parquet(out / "rejects.parquet")
    assert rejects[["file", "line", "code", "field"]].values.tolist() == [[str(logs), 2, "not_successful",
                                                                           "successful"]]


def test_the_ingest_key_changes_with_the_format_and_its_options(tmp_path):
    from race_core.config import IngestConfig
    from storage import ArtifactStore
    from tasks import stages

    logs = jsonl(tmp_path / "chat.jsonl", [openai_record(1), {k: v for k, v in openai_record(2).items()
                                                              if k != "successful"}])
    store = ArtifactStore(str(tmp_path / "store"))
    as_contract = stages.ingest(store, [str(logs)], IngestConfig())
    as_openai = stages.ingest(store, [str(logs)], IngestConfig(format="openai"))
    assumed = stages.ingest(store, [str(logs)], IngestConfig(format="openai", assume_successful=True))
    again = stages.ingest(store, [str(logs)], IngestConfig(format="openai", assume_successful=True))
    assert not (as_contract["cached"] or as_openai["cached"] or assumed["cached"]) and again["cached"]
    assert [m["metrics"]["ingested"] for m in (as_contract, as_openai, assumed)] == [0, 1, 2]
    assert assumed["metrics"]["assumed_successful"] == 1
    assert len({m["key"] for m in (as_contract, as_openai, assumed)}) == 3 and again["key"] == assumed["key"]


def test_run_serve_and_cover_take_the_format_options(capsys):
    from deployments import SERVE_DEFAULTS
    from flows.cli import build_parser
    from flows.options import config_from_args
    from race_core.config import PipelineConfig, from_dict

    parser = build_parser()
    run = parser.parse_args(["run", "--input", "a.jsonl", "--checkpoint", "/m", "--format", "swe-agent",
                             "--assume-successful", "--environment", "swe", "--source-revision", "v1"])
    ingest = config_from_args(PipelineConfig(), run).ingest
    assert (ingest.format, ingest.assume_successful, ingest.environment, ingest.source_revision) == (
        "swe-agent", True, "swe", "v1")
    serve = parser.parse_args(["serve", "--checkpoint", "/m", "--format", "sharegpt"])
    assert config_from_args(SERVE_DEFAULTS, serve).ingest.format == "sharegpt"
    with pytest.raises(SystemExit) as exited:  # argparse lists the formats
        main(["cover", "--format", "xml", "--out", "o"])
    assert exited.value.code == 2 and "invalid choice: 'xml'" in capsys.readouterr().err
    with pytest.raises(ValueError, match="parameter 'ingest.format': 'xml' is not one of"):  # the flow's own check
        from_dict(PipelineConfig, {"ingest": {"format": "xml"}})


def test_the_nightly_inbox_takes_raw_openai_logs(prefect_harness, tiny_checkpoint, tmp_path):
    from flows.nightly import race_nightly
    from race_core.config import IngestConfig, NightlyConfig

    inbox = tmp_path / "inbox"
    inbox.mkdir()
    jsonl(inbox / "monday.jsonl", [openai_record(1), openai_record(2, successful=False)])
    config = NightlyConfig(inbox=str(inbox / "*.jsonl"), checkpoint=str(tiny_checkpoint), store=str(tmp_path / "s"),
                           ingest=IngestConfig(format="openai"))
    first = race_nightly(config)
    assert (first["new"], first["rejected"], first["scored_trajectories"]) == (1, 1, 1)
    jsonl(inbox / "tuesday.jsonl", [openai_record(3)])
    second = race_nightly(config)
    assert (second["new"], second["already_compressed"]) == (1, 1)


@pytest.mark.parametrize("fmt", ["openai", "sharegpt", "swe-agent", "react"])
def test_a_file_of_another_format_is_skipped_record_by_record_not_crashed_on(tmp_path, fmt):
    path = jsonl(tmp_path / "other.jsonl", [{"question": "q", "turns": [], "successful": True}, [1, 2], 3])
    good, skipped, _ = imported(path, fmt)
    assert good == [] and len(skipped) == 4  # the record, the array's two elements, the number
    assert [code for _, code, _ in skipped][1:] == ["not_object"] * 3
