"""The one reader of a turn's text (`race_core.importers.turn_text`): what it takes for a call, what
it leaves as text, and what it refuses with which code."""

from __future__ import annotations

import pytest

from race_core.importers.common import SkipRecord
from race_core.importers.turn_text import assistant_steps, observation_text, results_of


def steps(text: str) -> list[tuple[str, list, str, str | None]]:
    return [(s.reasoning, s.calls, s.text, s.observation) for s in assistant_steps(text, "m")]


def test_plain_text_and_a_tag_named_in_prose_are_one_text_action():
    assert steps("<think>why</think>Paris.") == [("why", [], "Paris.", None)]
    assert steps("Use a <tool_call> tag to call.") == [("", [], "Use a <tool_call> tag to call.", None)]
    assert steps("Thought: nothing to do yet") == [("", [], "Thought: nothing to do yet", None)]  # no action: text


def test_hermes_blocks_are_parallel_calls_and_the_text_around_them_reasoning():
    text = ('<think>plan</think>Both.\n<tool_call>\n{"name": "a", "arguments": {"x": 1}}\n</tool_call>\n'
            '<tool_call>{"name": "b", "arguments": "{\\"y\\": 2}"}</tool_call>')
    assert steps(text) == [("plan\n\nBoth.", [{"name": "a", "arguments": {"x": 1}}, {"name": "b", "arguments": {"y": 2}}],
                            "", None)]


def test_react_actions_calls_and_in_text_observations():
    text = ("Thought: look\nAction: search\nAction Input: \"{\\\"q\\\": \\\"x\\\"}\"\nObservation: found\n"
            "Thought: then\nAction: {\"name\": \"open\", \"arguments\": {\"id\": 3}}")
    assert steps(text) == [("look", [{"name": "search", "arguments": {"q": "x"}}], "", "found"),  # input encoded twice
                           ("then", [{"name": "open", "arguments": {"id": 3}}], "", None)]
    assert steps("Action: lookup\nAction Input: the term") == [("", [], "lookup\nAction Input: the term", None)]


@pytest.mark.parametrize(("text", "code"), [
    ('<tool_call>{"name": "a", "arguments": {}}</tool_call><tool_call>{"name": "b"', "malformed_call"),
    ("<tool_call>not json</tool_call>", "malformed_call"),
    ('<tool_call>{"name": "a", "arguments": [1]}</tool_call>', "malformed_call"),
    ("Action: a\nAction: b", "missing_observation"),
    ("Question: q\nAction: a", "malformed_message"),
    ("Action: a\nObservation: o\nThought: and then?", "empty_action"),
])
def test_broken_structure_is_refused_with_its_code(text, code):
    with pytest.raises(SkipRecord) as refused:
        assistant_steps(text, "m")
    assert refused.value.code == code


def test_results_unwrap_tool_responses_and_observation_labels():
    assert results_of("<tool_response>\n{\"a\": 1}\n</tool_response>\n<tool_response>2</tool_response>") == (
        ['{"a": 1}', "2"], "")
    assert results_of("plain") == ([], "plain")
    assert observation_text("Observation:  5\n") == " 5\n" and observation_text("Observation 2: x") == "x"
    assert observation_text("No observation: x") is None
