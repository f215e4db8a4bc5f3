"""Agent-log shapes found in the wild (issue 26): ReAct text and Hermes calls inside chat formats,
LLaMA-Factory's typed parts, Glaive's calls, arguments encoded twice, boolean rewards, SWE-agent
function calling, the Responses API, LangChain / LangSmith dumps and Alpaca records, each read
from a fixture written after the format's public specification (cited in the fixture's
`_source`) and checked field by field; `--format auto`; and the accounting of every record read
(written, skipped with a code, or a duplicate)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from flows.cli import main
from race_core.importers import ImportOptions, ImportStats, import_stream
from race_core.schema import Reject, Trajectory, read_jsonl

FIXTURES = Path(__file__).parent / "fixtures" / "importers"


def imported(name: str, fmt: str, **options) -> tuple[list[dict], list[Reject], ImportStats]:
    """(each trajectory's contract dict, each reject, the counts) of one fixture."""
    stats = ImportStats()
    good, rejects = [], []
    with open(FIXTURES / name, "rb") as fh:
        for item in import_stream(fh, name, fmt, ImportOptions(**options), stats=stats):
            (rejects if isinstance(item, Reject) else good).append(item if isinstance(item, Reject) else item.to_dict())
    for t in good:
        assert Trajectory.from_dict(t).to_dict() == t  # every one a valid contract line, read back unchanged
        assert t["_source"]  # the fixture's citation: an unknown key, kept
    return good, rejects, stats


def test_react_text_in_toolbench_sharegpt_becomes_calls_answered_by_function_entries():
    [t], rejects, _ = imported("toolbench_react.json", "sharegpt")
    assert rejects == []
    assert t["question"] == "I'm planning a trip to Paris, what is the weather there?\nBegin!"
    assert t["system"].startswith("You are AutoGPT, you can use many tools(functions)")
    assert t["turns"] == [
        {"reasoning": "I should call the weather API for Paris.",
         "action": {"name": "get_weather_for_weather_api", "arguments": {"city": "Paris"}},
         "observation": "{\"error\": \"\", \"response\": \"{'city': 'Paris', 'temp_c': 18, 'sky': 'cloudy'}\"}"},
        {"reasoning": "I have the weather; give the answer.",
         "action": {"name": "Finish", "arguments": {"return_type": "give_answer",
                                                    "final_answer": "It is 18 C and cloudy in Paris."}},
         "observation": ""},
    ]
    assert t["source_id"].startswith("Step 2:") and t["source_format"] == "sharegpt"


def test_react_text_in_openai_messages_is_split_into_reasoning_actions_and_observations():
    paper, langchain_style = imported("openai_react.jsonl", "openai")[0]
    assert paper["question"] == "Which river flows through the capital of Austria?"
    assert paper["system"].startswith("Answer the question. Use: Thought, Action")
    # the user's "Observation:" message answers the step before; a message holding its own observations is several turns
    assert paper["turns"] == [
        {"reasoning": "The capital of Austria is Vienna; search which river flows through it.",
         "action": "search[Vienna river]", "observation": "Vienna lies on the Danube."},
        {"reasoning": "Check that it is the main river.", "action": "lookup[Danube]",
         "observation": "The Danube flows through Vienna."},
        {"reasoning": "Confirmed.", "action": "Final Answer: The Danube", "observation": ""},
    ]
    assert langchain_style["turns"] == [
        {"reasoning": "Use the calculator.", "action": {"name": "calculator", "arguments": {"expression": "0.12 * 250"}},
         "observation": "30.0"},
        {"reasoning": "I now know the final answer.", "action": "Final Answer: 30", "observation": ""},
    ]


def test_hermes_tool_calls_and_responses_are_calls_and_results_in_sharegpt_and_openai():
    (sharegpt, openai), rejects, stats = imported("hermes.jsonl", "auto")
    assert rejects == [] and stats.formats == {"hermes.jsonl": "sharegpt"}  # the first record decides the file
    assert sharegpt["question"] == "What are Apple's and Microsoft's stock prices?"
    assert "<tools>" in sharegpt["system"]  # the system prompt is kept as written
    assert sharegpt["turns"] == [
        {"reasoning": "I will look both up.",
         "action": [{"name": "get_stock_price", "arguments": {"symbol": "AAPL"}},
                    {"name": "get_stock_price", "arguments": {"symbol": "MSFT"}}],
         "observation": '{"name": "get_stock_price", "content": {"symbol": "AAPL", "price": 150.75}}\n\n'
                        '{"name": "get_stock_price", "content": {"symbol": "MSFT", "price": 295.4}}'},
        {"reasoning": "", "action": "Apple is at $150.75 and Microsoft at $295.40.", "observation": ""},
    ]
    # an OpenAI-style record in a file auto-read as sharegpt: the sharegpt reader takes role/content too
    assert openai["turns"] == [
        {"reasoning": "One call is enough.", "action": {"name": "get_weather", "arguments": {"city": "Oslo"}},
         "observation": "Oslo: -3 C, snow"},
        {"reasoning": "", "action": "It is -3 C and snowing in Oslo.", "observation": ""},
    ]
    good, rejects, _ = imported("hermes.jsonl", "openai")  # read as openai: the sharegpt record names its format
    assert [t["turns"] for t in good] == [openai["turns"]] and [r.code for r in rejects] == ["missing_field"]


def test_glaive_function_call_speakers_and_single_quoted_arguments():
    [t], rejects, _ = imported("glaive.jsonl", "sharegpt")
    assert rejects == []
    assert t["question"] == "Create a contact for John Doe, johndoe@example.com."
    assert t["turns"] == [
        {"reasoning": "", "action": {"name": "create_contact",
                                     "arguments": {"name": "John Doe", "email": "johndoe@example.com"}},
         "observation": '{"status": "success"}'},
        {"reasoning": "", "action": "The contact for John Doe has been created.", "observation": ""},
    ]


def test_llamafactory_typed_parts_give_reasoning_calls_and_text():
    [t], rejects, stats = imported("llamafactory_v1.json", "auto")
    assert rejects == [] and stats.formats == {"llamafactory_v1.json": "sharegpt"}
    assert (t["question"], t["system"]) == ("How many yen is 20 euros?", "You convert currencies with tools.")
    assert t["tools"] == [{"name": "get_exchange_rate", "description": "Exchange rate of two currencies",
                           "parameters": {"type": "object", "properties": {"base": {"type": "string"},
                                                                           "quote": {"type": "string"}}}}]
    assert t["turns"] == [
        {"reasoning": "I need the EUR/JPY rate first.\n\nLet me fetch the rate.",
         "action": {"name": "get_exchange_rate", "arguments": {"base": "EUR", "quote": "JPY"}},
         "observation": '{"rate": 162.5}'},
        {"reasoning": "20 * 162.5 = 3250.", "action": "20 euros is 3250 yen.", "observation": ""},
    ]


def test_arguments_encoded_twice_are_decoded_and_a_boolean_reward_is_a_success_flag():
    [t], rejects, _ = imported("openai_encodings.jsonl", "openai")
    assert t["turns"][0] == {"reasoning": "", "observation": "37.8",
                             "action": {"name": "to_celsius", "arguments": {"fahrenheit": 100}, "id": "call_f2c"}}
    assert [(r.line, r.code, r.field, r.message) for r in rejects] == [
        (2, "not_successful", "reward", "the record did not succeed: reward is False")]


def test_responses_api_items_become_reasoning_parallel_calls_and_results():
    [t], rejects, stats = imported("responses.json", "auto")
    assert rejects == [] and stats.formats == {"responses.json": "responses"}
    assert (t["question"], t["system"]) == ("Is it warmer in Paris or in Bogota right now?",
                                            "You are a weather assistant. Use the tools.")
    assert t["turns"] == [
        {"reasoning": "**Comparing two cities**\n\nI will ask for both temperatures at once.",
         "action": [{"name": "get_weather", "arguments": {"city": "Paris"}, "id": "call_paris"},
                    {"name": "get_weather", "arguments": {"city": "Bogota"}, "id": "call_bogota"}],
         "observation": "21 C\n\n14 C"},  # in call order, whatever order the outputs came in
        {"reasoning": "21 is more than 14, so Paris is warmer.",
         "action": "Paris is warmer: 21 C against 14 C in Bogota.", "observation": ""},
    ]
    assert [tool["name"] for tool in t["tools"]] == ["get_weather"]
    # what the contract has no field for: hosted tools, encrypted reasoning, the summary beside the content
    assert t["hosted_tools"] == [{"type": "web_search_preview"}]
    assert t["reasoning_items"] == [{"id": "rs_1", "encrypted_content": "gAAAAABoIzN3..."},
                                    {"id": "rs_2", "summary": [{"type": "summary_text", "text": "Short summary."}]}]
    assert (t["model"], t["usage"]["total_tokens"], t["source_id"]) == (
        "o4-mini-2025-04-16", 424, "resp_67ccd2bed1ec8190b14f964abc0542670bb6a6b452d3795b")


def test_langchain_dumps_and_langsmith_runs_keep_native_calls():
    (state, llm_run, graph_run), rejects, stats = imported("langchain.json", "auto", assume_successful=True)
    assert stats.formats == {"langchain.json": "langchain"} and stats.assumed_successful == 3
    assert [(r.code, r.field) for r in rejects] == [("not_successful", "error")]  # the run that raised
    assert (state["question"], state["system"]) == ("What is 17 * 23?", "You are a math tutor with a calculator.")
    assert state["turns"] == [  # the tool_use block is the same call as tool_calls: once
        {"reasoning": "Multiply with the tool.\n\nLet me compute.",
         "action": {"name": "multiply", "arguments": {"a": 17, "b": 23}, "id": "toolu_1"}, "observation": "391"},
        {"reasoning": "", "action": "17 * 23 = 391.", "observation": ""},
    ]
    assert state["thread_id"] == "thread-7"
    assert llm_run["question"] == "Find the population of Lyon."
    assert llm_run["turns"] == [
        {"reasoning": "Search for it.", "action": {"name": "search", "arguments": {"q": "Lyon population"},
                                                   "id": "call_s"},
         "observation": "Lyon has about 520,000 inhabitants."},
        {"reasoning": "", "action": "About 520,000 people live in Lyon.", "observation": ""},
    ]
    assert llm_run["tools"][0]["function"]["name"] == "search"  # from the run's invocation params
    assert (llm_run["run_type"], llm_run["name"]) == ("llm", "ChatOpenAI")
    # the graph's output repeats its input message: read once
    assert graph_run["question"] == "Say hi to Ada."
    assert graph_run["turns"] == [
        {"reasoning": "", "action": {"name": "greet", "arguments": {"name": "Ada"}, "id": "call_g"},
         "observation": "Hi, Ada!"},
        {"reasoning": "", "action": "I said hi to Ada.", "observation": ""},
    ]


def test_swe_agent_function_calling_keeps_the_calls_and_what_the_contract_has_no_field_for():
    [t], rejects, stats = imported("parser__parser-7.traj", "auto")
    assert rejects == [] and stats.formats == {"parser__parser-7.traj": "swe-agent"}
    assert t["question"].startswith("<uploaded_files>\n/testbed") and t["system"].startswith("You are a helpful")
    view, edit, submit = t["turns"]
    assert view == {"reasoning": "Let me look at the parser first.",
                    "action": {"name": "str_replace_editor", "arguments": {"command": "view",
                                                                           "path": "/testbed/src/parser.py"},
                               "id": "toolu_01"},
                    "observation": "Here's the result of running `cat -n` on /testbed/src/parser.py:\n"
                                   "     1\tdef parse(text):\n     2\t    return text.split(',')\n"}
    assert edit["reasoning"] == "The fields keep their spaces; strip them.\n\nStrip each field."  # thinking first
    assert edit["action"] == {"name": "str_replace_editor", "id": "toolu_02", "arguments": {
        "command": "str_replace", "path": "/testbed/src/parser.py", "old_str": "return text.split(',')",
        "new_str": "return [f.strip() for f in text.split(',')]"}}
    assert submit["action"] == {"name": "submit", "arguments": {}, "id": "toolu_03"}
    assert submit["observation"] == t["submission"]
    assert t["submission"].startswith("diff --git a/src/parser.py b/src/parser.py")
    assert t["model_stats"] == {"instance_cost": 0.042, "tokens_sent": 5120, "tokens_received": 310, "api_calls": 4}
    assert t["tool_config"]["parse_function"] == {"type": "function_calling"}
    assert json.loads(t["replay_config"])["agent"]["tools"] == t["tool_config"]
    assert t["info"]["swe_agent_version"] == "1.1.0" and "exit_status" not in t["info"]
    assert (t["exit_status"], t["instance_id"], t["environment"]) == ("submitted", "parser__parser-7", "main")
    # the requeried step (no tool call, never shown to the model again) is no turn, and is kept and counted
    assert [(s["index"], s["thought"], s["action"], s["why"]) for s in t["left_out_steps"]] == [
        (1, "I will edit the file now.", "", "not in the history: retried, the model never saw it")]
    assert stats.left_out_steps == 1 and stats.left_out_trajectories == 1 and "history_unpaired" not in t
    assert [s["execution_time"] for s in t["steps"]] == [0.12, 1.12, 2.12]
    assert not any("query" in s for s in t["steps"] + t["left_out_steps"])


def test_alpaca_records_with_react_output_take_instruction_and_input_as_the_question():
    (first, second), rejects, stats = imported("alpaca_react.json", "auto")
    assert rejects == [] and stats.formats == {"alpaca_react.json": "react"}
    assert first["question"] == "Answer with the help of the tools.\n\nHow old was Ada Lovelace when she died?"
    assert first["system"] == "You are a careful research assistant."
    assert first["turns"] == [
        {"reasoning": "I need her birth and death years.",
         "action": {"name": "wikipedia", "arguments": {"query": "Ada Lovelace"}},
         "observation": "Ada Lovelace (10 December 1815 - 27 November 1852) was an English mathematician."},
        {"reasoning": "1852 - 1815 = 37, and she died before her birthday.", "action": "Final Answer: 36",
         "observation": ""},
    ]
    assert second["question"] == "What is the capital of Peru?" and "system" not in second
    assert second["turns"][0] == {"reasoning": "Look it up.", "action": "Search[Peru capital]",
                                  "observation": "Lima is the capital of Peru."}


def test_a_text_only_assistant_message_before_one_that_calls_is_that_calls_reasoning(tmp_path):
    record = {"success": True, "messages": [
        {"role": "user", "content": "q?"},
        {"role": "assistant", "content": "<think>plan</think>First I look it up."},
        {"role": "assistant", "content": None, "tool_calls": [
            {"id": "c1", "type": "function", "function": {"name": "search", "arguments": "{}"}}]},
        {"role": "tool", "tool_call_id": "c1", "content": "found"},
        {"role": "assistant", "content": "done"}]}
    path = tmp_path / "said.jsonl"
    path.write_text(json.dumps(record) + "\n")
    with open(path, "rb") as fh:
        [t] = list(import_stream(fh, str(path), "openai"))
    assert [turn.reasoning for turn in t.turns] == ["plan\n\nFirst I look it up.", ""]


def test_a_missing_key_names_the_key_and_the_format_the_record_looks_like(tmp_path):
    path = tmp_path / "sg.jsonl"
    shutil.copy(FIXTURES / "glaive.jsonl", path)
    with open(path, "rb") as fh:
        [reject] = list(import_stream(fh, str(path), "openai"))
    assert (reject.code, reject.field) == ("missing_field", "messages")
    assert "looks like sharegpt: --format sharegpt, or --format auto" in reject.message
    other = tmp_path / "other.jsonl"
    other.write_text(json.dumps({"prompt": "p", "completion": "c"}) + "\n[1]\n")
    with open(other, "rb") as fh:
        rejects = list(import_stream(fh, str(other), "auto"))
    assert [(r.code, r.field) for r in rejects] == [("unknown_format", "<record>"), ("not_object", "<record>")]
    assert "['completion', 'prompt']" in rejects[0].message and "pass --format" in rejects[0].message


# -- every record read ends as written, skipped or a duplicate --------------------------------------
def test_race_import_auto_names_each_files_format_and_accounts_for_every_record(tmp_path, capsys):
    logs = tmp_path / "logs"
    logs.mkdir()
    for name in ("openai_react.jsonl", "responses.json", "parser__parser-7.traj", "openai_encodings.jsonl"):
        shutil.copy(FIXTURES / name, logs / name)
    twice = (FIXTURES / "openai_react.jsonl").read_text()
    (logs / "again.jsonl").write_text(twice + twice)  # 4 records: each trajectory a third and a fourth time
    out = tmp_path / "out.jsonl"
    assert main(["import", "--format", "auto", "--input", str(logs / "*"), "--out", str(out)]) == 0
    err = capsys.readouterr().err
    for name, fmt in (("openai_react.jsonl", "openai"), ("responses.json", "responses"),
                      ("parser__parser-7.traj", "swe-agent"), ("again.jsonl", "openai")):
        assert f"{logs / name}: format {fmt} (--format auto)" in err
    # the files are read in name order: again.jsonl first
    assert f"{logs / 'again.jsonl'}:3: [duplicate] <record>: the same trajectory" in err
    assert f"{logs / 'openai_react.jsonl'}:2: [duplicate] <record>: the same trajectory" in err
    assert f"as {logs / 'again.jsonl'}:2; merged into it" in err
    # 2 + 2 + 1 + 1 + 4 records
    assert ("10 record(s) read from 5 file(s) = 5 trajectories written to " in err
            and "+ 1 record(s) skipped (not_successful 1) + 4 duplicate(s) merged into the first of each" in err)
    trajectories, rejects = read_jsonl([out])
    assert len(trajectories) == 5 and rejects == [] and len(out.read_text().splitlines()) == 5


def test_validate_and_ingest_count_and_list_duplicates(tmp_path, capsys):
    from race_core.config import IngestConfig
    from storage import ArtifactStore
    from storage.parquet import read_dataset_from_store
    from tasks import stages

    path = tmp_path / "chat.jsonl"
    lines = (FIXTURES / "openai_react.jsonl").read_text().splitlines()
    path.write_text("\n".join([lines[0], lines[1], lines[0], "{broken"]) + "\n")
    assert main(["validate", "--format", "openai", "--input", str(path)]) == 1  # the broken line, not the duplicate
    out = capsys.readouterr().out
    assert "valid trajectories: 2" in out and "rejected lines: 1" in out
    assert "duplicates: 1 (merged into the first of each; records read = 4)" in out
    assert f"{path}:3: [duplicate] <record>: the same trajectory" in out

    contract = tmp_path / "contract.jsonl"
    assert main(["import", "--format", "openai", "--input", str(path), "--out", str(contract)]) == 0
    contract.write_text(contract.read_text() * 3)
    assert main(["validate", "--input", str(contract)]) == 0  # duplicates are listed, not rejected
    out = capsys.readouterr().out
    assert "valid trajectories: 2" in out and "duplicates: 4" in out

    store = ArtifactStore(str(tmp_path / "store"))
    manifest = stages.ingest(store, [str(path)], IngestConfig(format="openai"))
    assert (manifest["metrics"]["ingested"], manifest["metrics"]["rejected"], manifest["metrics"]["duplicates"]) == (
        2, 1, 1)
    rejects = read_dataset_from_store(store, manifest["objects"]["rejects"], "rejects")
    assert sorted(rejects["code"]) == ["duplicate", "not_json"]
    row = rejects[rejects["code"] == "duplicate"].iloc[0]
    assert (row["line"], row["trajectory_id"] is not None) == (3, True)


def test_assume_successful_counts_only_the_trajectories_written(tmp_path, capsys):
    unflagged = {"messages": [{"role": "user", "content": "q"}, {"role": "assistant", "content": "a"}]}
    broken = {"messages": [{"role": "user", "content": "q"}]}  # no flag, and no turn: skipped afterwards
    path = tmp_path / "chat.jsonl"
    path.write_text("\n".join(json.dumps(r) for r in (unflagged, broken, unflagged)) + "\n")
    stats = ImportStats()
    with open(path, "rb") as fh:
        from race_core.schema import Duplicates

        items = list(import_stream(fh, str(path), "openai", ImportOptions(assume_successful=True), stats=stats,
                                   duplicates=Duplicates()))
    assert [getattr(i, "code", "written") for i in items] == ["written", "no_turns", "duplicate"]
    assert (stats.assumed_successful, stats.imported, stats.duplicates, stats.read) == (1, 1, 1, 3)


@pytest.mark.parametrize("name", sorted(p.name for p in FIXTURES.iterdir() if p.name != "README.md"))
def test_every_fixture_cites_its_source_in_every_record(name):
    text = (FIXTURES / name).read_text()
    records = [json.loads(line) for line in text.splitlines()] if name.endswith(".jsonl") else json.loads(text)
    for record in records if isinstance(records, list) else [records]:
        assert len(record["_source"]) > 15, name


def test_a_record_without_a_success_flag_is_told_every_key_looked_for(tmp_path):
    traj = json.loads((FIXTURES / "parser__parser-7.traj").read_text())
    del traj["info"]["exit_status"]
    path = tmp_path / "no-status.traj"
    path.write_text(json.dumps(traj))
    with open(path, "rb") as fh:
        [reject] = list(import_stream(fh, str(path), "swe-agent"))
    assert (reject.code, reject.field) == ("no_success_flag", "<record>")
    assert "looked for successful, success, resolved, reward, info.exit_status" in reject.message


def test_hermes_function_calling_v1_as_published_writes_its_calls_as_python_literals():
    """The data set's own records (fixture after its card): calls `{'arguments': {...}, 'name': ...}` with
    single quotes and True / None are read as calls, the text kept in `extra`; results stay as written."""
    (flights, prices), rejects, stats = imported("hermes_function_calling_v1.jsonl", "auto", assume_successful=True)
    assert stats.formats == {"hermes_function_calling_v1.jsonl": "sharegpt"}
    assert flights["question"] == "Find economy flights from Oslo to Rome on 2024-05-02 that I can cancel."
    assert flights["system"].startswith("You are a function calling AI model.")
    assert flights["turns"][0]["action"] == {"name": "search_flights", "arguments": {
        "origin": "Oslo", "destination": "Rome", "date": "2024-05-02", "class": "economy", "flexible_cancellation": True,
        "max_stops": None, "seats": 1}}
    # a <tool_response> body that is a Python literal is the observation, unchanged
    assert flights["turns"][0]["observation"] == ("{'name': 'search_flights', 'content': {'flights': [{'id': 'SK4711', "
                                                  "'price': 129.5, 'refundable': True}, {'id': 'AZ611', 'price': 99.0, "
                                                  "'refundable': False}]}}")
    assert flights["turns"][1] == {"reasoning": "", "observation": "", "action": (
        "Flight SK4711 costs 129.50 and can be cancelled; AZ611 is cheaper but not refundable.")}
    assert flights["tool_call_text"] == [{"at": "conversations[2].content: <tool_call> 1", "text": (
        "{'arguments': {'origin': 'Oslo', 'destination': 'Rome', 'date': '2024-05-02', 'class': 'economy', "
        "'flexible_cancellation': True, 'max_stops': None, 'seats': 1}, 'name': 'search_flights'}")}]
    assert (flights["source_id"], flights["category"], flights["task"]) == ("a1f0c2", "Travel", "Search flights")
    # two blocks: parallel calls, one turn; a double-quoted string inside a literal
    assert prices["turns"][0]["action"] == [{"name": "get_price", "arguments": {"symbol": "ACME", "exchange": "O'Hare"}},
                                            {"name": "get_price", "arguments": {"symbol": "INITECH", "exchange": None}}]
    assert [t["at"] for t in prices["tool_call_text"]] == ["conversations[2].content: <tool_call> 1",
                                                           "conversations[2].content: <tool_call> 2"]
    # neither JSON nor a literal (a function call inside): refused with both parsers' reasons, never run
    [bad] = rejects
    assert bad.code == "malformed_call" and "is not valid JSON: Expecting property name" in bad.message
    assert "nor a Python literal call: Call is not a literal" in bad.message


def test_a_python_literal_call_is_bounded_and_must_be_a_call_of_json_values():
    from race_core.importers.common import (
        MAX_LITERAL_DEPTH,
        SkipRecord,
        arguments_of,
        calls_from_json,
        python_literal,
    )

    assert python_literal("{'a': (1, 2), 'b': -3.5, 'c': None}") == ({"a": [1, 2], "b": -3.5, "c": None}, None)
    deep = "[" * (MAX_LITERAL_DEPTH + 1) + "]" * (MAX_LITERAL_DEPTH + 1)
    for text, why in ((deep, "nested deeper than"), ("{1, 2}", "Set is not a literal"), ("{'a': b'x'}", "bytes"),
                      ("{'a': 1e999}", "not a finite number"), ("{1: 'x'}", "not a string"), ("'x' * 10**9", "BinOp"),
                      ("x" * 2_000_000, "longer than")):
        value, reason = python_literal(text)
        assert value is None and why in reason, (text[:20], reason)
    assert calls_from_json("{'name': 'f', 'parameters': {'a': True}}", "w") == [{"name": "f", "arguments": {"a": True}}]
    assert calls_from_json('{"name": "f", "parameters": {"a": 1}}', "w") == [{"name": "f", "arguments": {"a": 1}}]
    with pytest.raises(SkipRecord, match="nor a Python literal call: not a call"):
        calls_from_json("{'name': 'f', 'arguments': ['a']}", "w")
    assert arguments_of("{'city': 'Oslo', 'metric': False}", "w") == {"city": "Oslo", "metric": False}
    with pytest.raises(SkipRecord, match="nor a Python literal dict: a list, not a dict"):
        arguments_of("['Oslo']", "w")


def test_a_swe_agent_run_follows_the_history_and_says_which_steps_it_left_out(capsys, tmp_path):
    """An EnIGMA (SWE-agent 0.x) CTF run: five executed steps, four in the history the model saw (the
    edit the linter rejected was retried, and only the retry stayed); the history's actions and
    thoughts differ from the steps' by a trailing newline."""
    [t], rejects, stats = imported("ctf__xor-me.traj", "auto")
    assert rejects == [] and [turn["action"] for turn in t["turns"]] == [
        "open decode.py", "edit 3:3\n    key = 0x13 ^ ord(c)\nend_of_edit", "python decode.py cipher.txt",
        "submit 'flag{x0r_1s_n0t_crypt0}'"]
    assert t["turns"][1]["observation"] == "File updated."
    [left] = t["left_out_steps"]
    assert (left["index"], left["action"], left["observation"].split(".")[0]) == (
        1, "edit 3:3\n    key = 0x13 ^ ord(c\nend_of_edit\n", "Your proposed edit has introduced new syntax error(s)")
    assert (stats.left_out_steps, stats.left_out_trajectories) == (1, 1)
    assert main(["import", "--format", "swe-agent", "--input", str(FIXTURES / "ctf__xor-me.traj"),
                 "--out", str(tmp_path / "out.jsonl")]) == 0
    assert ("race import: 1 step(s) of 1 trajectories left out: the run's other record has them, the history the "
            "model saw does not (kept in extra.left_out_steps)") in capsys.readouterr().err
