"""The input contract: each rule has its own code; the reader keeps going past bad lines."""

import json

import pytest

from race_core import schema
from race_core.schema import Limits, SchemaError, Trajectory, read_jsonl


def good(**over):
    d = {"question": "Compute 2 + 3.", "environment": "bounded-calculator-v1", "source_revision": "r1",
         "split": "train", "successful": True,
         "turns": [{"reasoning": "add", "action": "calc[2 + 3]", "observation": "5"},
                   {"reasoning": "", "action": "finish[5]", "observation": ""}]}
    d.update(over)
    return d


def without(key):
    d = good()
    del d[key]
    return d


CASES = [
    ([1, 2], schema.NOT_OBJECT, "<record>"),
    (without("question"), schema.MISSING_FIELD, "question"),
    (good(question="  "), schema.EMPTY_FIELD, "question"),
    (good(environment=3), schema.WRONG_TYPE, "environment"),
    (without("source_revision"), schema.MISSING_FIELD, "source_revision"),
    (good(split="test"), schema.BAD_SPLIT, "split"),
    (good(successful=False), schema.NOT_SUCCESSFUL, "successful"),
    (good(successful="true"), schema.NOT_SUCCESSFUL, "successful"),
    (without("successful"), schema.MISSING_FIELD, "successful"),
    (without("turns"), schema.MISSING_FIELD, "turns"),
    (good(turns={"a": 1}), schema.BAD_TURNS, "turns"),
    (good(turns=[]), schema.EMPTY_TURNS, "turns"),
    (good(turns=["x"]), schema.BAD_TURN, "turns[0]"),
    (good(turns=[{"reasoning": "r", "observation": ""}]), schema.EMPTY_ACTION, "turns[0].action"),
    (good(turns=[{"reasoning": "r", "action": " ", "observation": ""}]), schema.EMPTY_ACTION, "turns[0].action"),
    (good(turns=[{"reasoning": 5, "action": "a", "observation": ""}]), schema.WRONG_TYPE, "turns[0].reasoning"),
    (good(turns=[{"reasoning": "", "action": "a", "observation": ["x"]}]), schema.WRONG_TYPE,
     "turns[0].observation"),
    (good(question="x" * 101), schema.FIELD_TOO_LARGE, "question"),
    (good(id=""), schema.BAD_ID, "id"),
    (good(question="q\ud800"), schema.BAD_TEXT, "<record>"),
    (good(score=float("nan")), schema.NON_FINITE_NUMBER, "score"),
    (good(turns=[{"reasoning": "r", "action": "a", "observation": float("inf")}]), schema.NON_FINITE_NUMBER, "turns"),
    (good(tree=json.loads("[" * 150 + "]" * 150)), schema.TOO_DEEP, "<record>"),
    (good(small="s", blob="x" * (2 << 20)), schema.EXTRA_TOO_LARGE, "blob"),
    # tool calls (docs/architecture.md §2): a call needs a non-empty name and object arguments
    (good(turns=[{"action": {"arguments": {}}}]), schema.BAD_TOOL_CALL, "turns[0].action.name"),
    (good(turns=[{"action": {"name": " ", "arguments": {}}}]), schema.BAD_TOOL_CALL, "turns[0].action.name"),
    (good(turns=[{"action": {"name": "f", "arguments": '{"x": 1}'}}]), schema.BAD_TOOL_CALL,
     "turns[0].action.arguments"),
    (good(turns=[{"action": [{"name": "f", "arguments": {}}, "g"]}]), schema.BAD_TOOL_CALL, "turns[0].action[1]"),
    (good(turns=[{"action": {"type": "function", "function": {"name": "f"}}}]), schema.BAD_TOOL_CALL,
     "turns[0].action.function"),
    (good(turns=[{"action": []}]), schema.EMPTY_ACTION, "turns[0].action"),
    (good(turns=[{"action": 7}]), schema.WRONG_TYPE, "turns[0].action"),
    (good(turns=[{"action": {"name": "f", "arguments": {"q": "x" * 101}}}]), schema.FIELD_TOO_LARGE,
     "turns[0].action"),
    (good(system=["s"]), schema.WRONG_TYPE, "system"),
    (good(tools={"name": "f"}), schema.BAD_TOOLS, "tools"),
    (good(tools=[{"description": "no name"}]), schema.BAD_TOOLS, "tools[0]"),
]


@pytest.mark.parametrize(("record", "code", "field"), CASES, ids=[c[1] + ":" + c[2] for c in CASES])
def test_each_rule_is_rejected_with_its_code(record, code, field):
    with pytest.raises(SchemaError) as info:
        Trajectory.from_dict(record, Limits(max_field_chars=100))
    assert info.value.code == code
    assert info.value.field == field
    assert field in str(info.value)


def test_tool_calls_system_and_tools_round_trip_and_enter_the_id():
    tools = [{"type": "function", "function": {"name": "search", "parameters": {"type": "object"}}}]
    record = good(system="Be brief.", tools=tools, turns=[
        {"reasoning": "look", "action": {"name": "search", "arguments": {"q": "ü", "k": 2}, "id": "c1"},
         "observation": "hit"},
        {"reasoning": "", "action": [{"name": "search", "arguments": {"q": "a"}}, {"name": "open", "arguments": {}}],
         "observation": "A\nB"},
        {"reasoning": "done", "action": "finish[5]"}])
    t = Trajectory.from_dict(record)
    first, parallel, last = t.turns
    assert [(c.name, c.arguments, c.id) for c in first.tool_calls] == [("search", {"q": "ü", "k": 2}, "c1")]
    assert [c.name for c in parallel.tool_calls] == ["search", "open"] and parallel.observation == "A\nB"
    assert last.tool_calls == () and last.action_text == "finish[5]"
    assert json.loads(first.action_text) == {"name": "search", "arguments": {"q": "ü", "k": 2}}  # ids never rendered
    assert json.loads(parallel.action_text) == [{"name": "search", "arguments": {"q": "a"}},
                                                {"name": "open", "arguments": {}}]
    assert (t.system, t.tools) == ("Be brief.", tuple(tools))
    again = Trajectory.from_dict(t.to_dict())
    assert again == t and again.id == t.id
    assert t.to_dict()["turns"][0]["action"] == record["turns"][0]["action"]
    # system and tools are part of the identity; without them the id is that of a text-only record
    assert Trajectory.from_dict({**record, "system": "Be long."}).id != t.id
    assert Trajectory.from_dict({**record, "tools": []}).id != t.id
    plain = good()
    assert Trajectory.from_dict(plain).id == Trajectory.from_dict({**plain, "system": None, "tools": None}).id


def test_every_error_code_is_distinct_and_exercised():
    assert len(set(schema.ERROR_CODES)) == len(schema.ERROR_CODES)
    # The line-level codes are exercised by the mixed-file test below and tests/test_ingest_faults.py.
    line_codes = {schema.NOT_JSON, schema.LINE_TOO_LONG, schema.UNREADABLE}
    assert {c[1] for c in CASES} | line_codes == set(schema.ERROR_CODES)


def test_id_is_a_content_hash_and_extra_keys_are_kept():
    a = Trajectory.from_dict(good(task="t1"))
    b = Trajectory.from_dict({**good(), "task": "other", "id": "source-7"})
    assert a.id == b.id and len(a.id) == 64
    assert a.extra == {"task": "t1"} and b.extra == {"task": "other", "source_id": "source-7"}
    assert Trajectory.from_dict(a.to_dict()) == a  # round trip keeps everything
    changed = good()
    changed["turns"][0]["reasoning"] = "other"
    assert Trajectory.from_dict(changed).id != a.id


def test_a_file_mixing_good_and_bad_lines_keeps_every_good_row(tmp_path):
    lines = [
        json.dumps(good()),
        "{not json",
        json.dumps(without("question")),
        json.dumps(good(split="test")),
        json.dumps(good(successful=False)),
        json.dumps(good(turns=[{"reasoning": "r", "action": "", "observation": ""}])),
        json.dumps(good(turns=[{"reasoning": 1.5, "action": "a", "observation": ""}])),
        json.dumps(good(question="big " + "x" * 10_000_000)),
        "",
        json.dumps(good(question="Compute 4 + 4.")),
        json.dumps(good()),  # a duplicate of line 1: one row
        b"\xff\xfe garbage".decode("latin-1"),
    ]
    path = tmp_path / "mixed.jsonl"
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    trajectories, rejects = read_jsonl([path])
    assert sorted(t.question for t in trajectories) == ["Compute 2 + 3.", "Compute 4 + 4."]
    got = [(r.line, r.code) for r in rejects]
    assert got == [(2, schema.NOT_JSON), (3, schema.MISSING_FIELD), (4, schema.BAD_SPLIT),
                   (5, schema.NOT_SUCCESSFUL), (6, schema.EMPTY_ACTION), (7, schema.WRONG_TYPE),
                   (8, schema.FIELD_TOO_LARGE), (12, schema.NOT_JSON)]
    assert all(r.file == str(path) for r in rejects)


def test_invalid_utf8_bytes_reject_only_their_line(tmp_path):
    path = tmp_path / "bytes.jsonl"
    path.write_bytes(json.dumps(good()).encode() + b"\n" + b'{"question": "\xff"}\n' + json.dumps(good()).encode())
    trajectories, rejects = read_jsonl([path])
    assert len(trajectories) == 1
    assert [(r.line, r.code) for r in rejects] == [(2, schema.BAD_TEXT)]
