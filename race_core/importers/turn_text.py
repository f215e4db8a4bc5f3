"""The text of a turn, wherever it appears (a chat message, a ShareGPT entry, a ReAct log): the one
place that reads the conventions agents write their steps in.

- ReAct (`Thought:` / `Action:` / `Action Input:` / `Observation:` / `Final Answer:` lines,
  numbered labels such as `Thought 1:` too; `Question:` only where a whole log is read): `Thought`
  text (and text before the first label) is the reasoning of the next action. `Action: NAME` with
  an `Action Input:` that is a JSON object (or a JSON string of one) is the tool call `{"name":
  NAME, "arguments": {...}}`; with any other input the action stays text, as the agent wrote it:
  `NAME\\nAction Input: INPUT`. An `Action:` that is itself a call's JSON (`{"name", "arguments"}`,
  or a list of them: how a template without tool support renders calls) is that call. Otherwise
  the action is its text (`Search[Paris]`). `Observation:` is the result of the action before it;
  `Final Answer: X` is the text action `Final Answer: X`.
- Hermes function calling: `<tool_call>{"name": ..., "arguments": ...}</tool_call>` blocks are the
  step's calls (several: parallel calls), the text around them what the model said before acting
  (reasoning); a text with no whole block (a tag named in prose) is no call. Results come back as
  `<tool_response>...</tool_response>` blocks, one per call.
- `<think>...</think>` opening an assistant text is reasoning (`common.split_think`).
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any

from race_core.importers.common import (
    MALFORMED_CALL,
    MALFORMED_MESSAGE,
    MISSING_OBSERVATION,
    ORPHAN_OBSERVATION,
    SkipRecord,
    calls_from_json,
    is_call_json,
    joined,
    json_object,
    split_think,
)
from race_core.schema import EMPTY_ACTION

QUESTION, THOUGHT, ACTION, ACTION_INPUT, OBSERVATION, FINAL = (
    "Question", "Thought", "Action", "Action Input", "Observation", "Final Answer")
_LABEL = re.compile(r"^(Question|Thought|Action Input|Action|Observation|Final Answer)(?:[ \t]*\d+)?[ \t]*:[ \t]?",
                    re.MULTILINE)
_ACTS = re.compile(r"^(?:Action|Final Answer)(?:[ \t]*\d+)?[ \t]*:", re.MULTILINE)
_OBSERVATION_LABEL = re.compile(r"\A[ \t]*Observation(?:[ \t]*\d+)?[ \t]*:[ \t]?")
_TOOL_CALL = re.compile(r"<tool_call>(.*?)</tool_call>", re.DOTALL)
_TOOL_RESPONSE = re.compile(r"<tool_response>\n?(.*?)\n?</tool_response>", re.DOTALL)


@dataclass
class Step:
    """One action of a turn's text: its reasoning, its calls (the contract's `{"name", "arguments"}`)
    or else its text action, and the observation the text holds for it (None: none there)."""

    reasoning: str
    calls: list[dict[str, Any]]
    text: str
    observation: str | None = None


@dataclass
class ReactLog:
    """A whole ReAct text read (`react_log`): the text before a leading Question line (a prompt),
    the Question line's text, the steps, and the thought left at the end with no action after it."""

    prompt: str
    question: str
    steps: list[Step]
    trailing_thought: str


def has_react_action(text: str) -> bool:
    """Whether the text holds an `Action:` or `Final Answer:` line: what makes it ReAct."""
    return _ACTS.search(text) is not None


def react_log(text: str, where: str, question_allowed: bool = True) -> ReactLog:
    """The steps of a ReAct text (see the module docstring), in order; raises `SkipRecord` for an
    observation without an action, an action without the observation before the next, an action
    input without its action, or a step after the Final Answer. Text before the first label is a
    thought (LangChain logs start right after the prompt's `Thought:`), unless a Question line
    follows it: then it is the prompt."""
    found = list(_LABEL.finditer(text))
    preamble = (text[:found[0].start()] if found else text).strip()
    prompt = ""
    if found and found[0].group(1) == QUESTION and preamble:
        prompt, preamble = preamble, ""
    steps: list[Step] = []
    thoughts = [preamble] if preamble else []
    question = ""
    name: str | None = None  # the open action's name, until its input (or anything else) comes
    final = False
    for k, match in enumerate(found):
        label = match.group(1)
        body = text[match.end():found[k + 1].start() if k + 1 < len(found) else len(text)].strip()
        at = f"{where}: block {k + 1} ({label})"
        if final:
            raise SkipRecord(MALFORMED_MESSAGE, at, "a step after the Final Answer")
        if label == QUESTION:
            if not question_allowed:
                raise SkipRecord(MALFORMED_MESSAGE, at, "a Question: inside an assistant message")
            if steps or thoughts or question:
                raise SkipRecord(MALFORMED_MESSAGE, at, "a second Question, or one after the first step")
            question = body
        elif label == THOUGHT:
            thoughts.append(body)
        elif label == ACTION_INPUT:
            if name is None:
                raise SkipRecord(MALFORMED_CALL, at, "an Action Input without the Action before it")
            steps[-1].calls, steps[-1].text = _with_input(name, body)
            name = None
        elif label == OBSERVATION:
            if not steps or steps[-1].observation is not None:
                raise SkipRecord(ORPHAN_OBSERVATION, at, "an Observation with no Action before it")
            steps[-1].observation = body
            name = None
        else:  # Action or Final Answer: a new step
            if steps and steps[-1].observation is None:
                raise SkipRecord(MISSING_OBSERVATION, at, "the Action before this one has no Observation")
            if label == ACTION and not body:
                raise SkipRecord(MALFORMED_CALL, at, "an Action without a name")
            if label == FINAL:
                steps.append(Step(joined(thoughts, "\n"), [], f"{FINAL}: {body}", ""))
                final = True
            else:
                calls = _call_text(body, at)
                steps.append(Step(joined(thoughts, "\n"), calls, "" if calls else body))
            thoughts = []
            name = body if label == ACTION else None
    return ReactLog(prompt, question, steps, joined(thoughts, "\n"))


def _with_input(name: str, arguments: str) -> tuple[list[dict[str, Any]], str]:
    """A tool call when the input is a JSON object, else the action as the agent wrote it."""
    parsed = json_object(arguments)
    if parsed is not None:
        return [{"name": name, "arguments": parsed}], ""
    return [], f"{name}\n{ACTION_INPUT}: {arguments}"


def _call_text(body: str, where: str) -> list[dict[str, Any]]:
    """The calls of an Action whose text is exactly a call's JSON; [] for any other action."""
    if not body.startswith(("{", "[")):
        return []
    try:
        parsed = json.loads(body)
    except json.JSONDecodeError:
        return []
    return calls_from_json(body, where) if is_call_json(parsed) else []


def assistant_steps(text: str, where: str) -> list[Step]:
    """The steps of an assistant message's text: a `<think>` block, then Hermes `<tool_call>`
    blocks, ReAct labels, or else the whole rest as one text action (empty text: no step)."""
    reasoning, rest = split_think(text, where)
    said, calls = hermes_calls(rest, where)
    if calls:
        return [Step(joined([reasoning, said], "\n\n"), calls, "")]
    if has_react_action(rest):
        log = react_log(rest, where, question_allowed=False)
        if log.trailing_thought:
            raise SkipRecord(EMPTY_ACTION, where, "the text ends with a Thought that no Action follows")
        log.steps[0].reasoning = joined([reasoning, log.steps[0].reasoning], "\n\n")
        return log.steps
    return [Step(reasoning, [], rest)] if rest or reasoning else []


def is_structured(text: str) -> bool:
    """Whether an assistant text holds Hermes calls or ReAct actions (not a plain text action)."""
    return has_react_action(text) or _TOOL_CALL.search(text) is not None


def hermes_calls(text: str, where: str) -> tuple[str, list[dict[str, Any]]]:
    """(the text outside the blocks, the calls of the `<tool_call>...</tool_call>` blocks) of an
    assistant text; (text, []) when it has no whole block (a tag named in prose is text)."""
    blocks = list(_TOOL_CALL.finditer(text))
    if not blocks:
        return text, []
    calls: list[dict[str, Any]] = []
    for k, block in enumerate(blocks):
        calls.extend(calls_from_json(block.group(1).strip(), f"{where}: <tool_call> {k + 1}"))
    rest = _TOOL_CALL.sub("", text).strip()
    if "<tool_call>" in rest:
        raise SkipRecord(MALFORMED_CALL, where, "a <tool_call> is never closed by </tool_call>")
    return rest, calls


def results_of(text: str) -> tuple[list[str], str]:
    """(the contents of the `<tool_response>` blocks, the text outside them, stripped) of a message
    that reports results; ([], text) when it has no such block."""
    blocks = [block.group(1) for block in _TOOL_RESPONSE.finditer(text)]
    if not blocks:
        return [], text
    return blocks, _TOOL_RESPONSE.sub("", text).strip()


def observation_text(text: str) -> str | None:
    """The text after a leading `Observation:` label; None when the text does not start with one."""
    label = _OBSERVATION_LABEL.match(text)
    return None if label is None else text[label.end():]
