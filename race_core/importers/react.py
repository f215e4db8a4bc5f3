"""ReAct text logs: a record holding the agent's text (`Thought:` / `Action:` / `Action Input:` /
`Observation:` / `Final Answer:` lines, numbered labels such as `Thought 1:` too) and its question
(a `question` / `input` / `query` key, or a `Question:` line in the text).

- `Thought:` text is the reasoning of the next action; text before the first label is a thought
  too (LangChain logs start right after the prompt's `Thought:`), unless a `Question:` follows it:
  then it is the prompt, the system text.
- `Action: NAME` with `Action Input: {...}` (a JSON object): the tool call `{"name": NAME,
  "arguments": {...}}`. With any other input the action stays text, as the agent wrote it:
  `NAME\\nAction Input: INPUT`. Without an input: the action text itself (`Search[Paris]`).
- `Observation:` is the result of the action before it; an action before the last turn must have one.
- `Final Answer: X` is the last turn's text action, `Final Answer: X`.
"""

from __future__ import annotations

import json
import re
from typing import Any

from race_core.importers.common import (
    MALFORMED_CALL,
    MALFORMED_MESSAGE,
    MISSING_OBSERVATION,
    NO_QUESTION,
    NO_TURNS,
    ORPHAN_OBSERVATION,
    Conversation,
    SkipRecord,
    joined,
)
from race_core.schema import EMPTY_ACTION, MISSING_FIELD, WRONG_TYPE

NAME = "react"
TEXT_KEYS = ("text", "trajectory", "log", "output")  # the first one present holds the ReAct text
QUESTION_KEYS = ("question", "input", "query")
QUESTION, THOUGHT, ACTION, ACTION_INPUT, OBSERVATION, FINAL = (
    "Question", "Thought", "Action", "Action Input", "Observation", "Final Answer")
_LABEL = re.compile(r"^(Question|Thought|Action Input|Action|Observation|Final Answer)(?:[ \t]*\d+)?[ \t]*:[ \t]?",
                    re.MULTILINE)


def convert(record: dict[str, Any], source: str) -> Conversation:
    text_key = next((k for k in TEXT_KEYS if k in record), None)
    if text_key is None:
        raise SkipRecord(MISSING_FIELD, TEXT_KEYS[0], f"the ReAct text is required, under one of {list(TEXT_KEYS)}")
    text = record[text_key]
    if not isinstance(text, str):
        raise SkipRecord(WRONG_TYPE, text_key, f"must be a string, got {type(text).__name__}")
    question_key = next((k for k in QUESTION_KEYS if record.get(k) is not None), None)
    question = record[question_key] if question_key else ""
    if not isinstance(question, str):
        raise SkipRecord(WRONG_TYPE, question_key, f"must be a string, got {type(question).__name__}")
    preamble, blocks = _blocks(text)
    system = ""
    if blocks and blocks[0][0] == QUESTION and preamble:
        system, preamble = preamble, ""
    turns, asked = _turns(preamble, blocks, text_key)
    question = question.strip() or asked
    if not question:
        raise SkipRecord(NO_QUESTION, QUESTION_KEYS[0], f"no {list(QUESTION_KEYS)} key and no Question: line")
    return Conversation(question=question, turns=turns, system=system,
                        consumed=tuple(k for k in (text_key, question_key) if k))


def _blocks(text: str) -> tuple[str, list[tuple[str, str]]]:
    """(text before the first label, [(label, its text), ...])."""
    found = list(_LABEL.finditer(text))
    preamble = (text[:found[0].start()] if found else text).strip()
    blocks = [(m.group(1), text[m.end():found[k + 1].start() if k + 1 < len(found) else len(text)].strip())
              for k, m in enumerate(found)]
    return preamble, blocks


def _turns(preamble: str, blocks: list[tuple[str, str]], key: str) -> tuple[list[dict[str, Any]], str]:
    """The turns and the question of a Question: line ("" when there is none)."""
    turns: list[dict[str, Any]] = []
    thoughts = [preamble] if preamble else []
    question = ""
    name: str | None = None  # the open action's name, until its input (or anything else) comes
    observed = True  # whether the last turn has its observation
    final = False
    for k, (label, body) in enumerate(blocks):
        where = f"{key}: block {k + 1} ({label})"
        if final:
            raise SkipRecord(MALFORMED_MESSAGE, where, "a step after the Final Answer")
        if label == QUESTION:
            if turns or thoughts or question:
                raise SkipRecord(MALFORMED_MESSAGE, where, "a second Question, or one after the first step")
            question = body
        elif label == THOUGHT:
            thoughts.append(body)
        elif label == ACTION_INPUT:
            if name is None:
                raise SkipRecord(MALFORMED_CALL, where, "an Action Input without the Action before it")
            turns[-1]["action"] = _action(name, body)
            name = None
        elif label == OBSERVATION:
            if observed:
                raise SkipRecord(ORPHAN_OBSERVATION, where, "an Observation with no Action before it")
            turns[-1]["observation"] = body
            name, observed = None, True
        else:  # Action or Final Answer: a new turn
            if not observed:
                raise SkipRecord(MISSING_OBSERVATION, where, "the Action before this one has no Observation")
            if label == ACTION and not body:
                raise SkipRecord(MALFORMED_CALL, where, "an Action without a name")
            action = body if label == ACTION else f"{FINAL}: {body}"
            turns.append({"reasoning": joined(thoughts, "\n"), "action": action, "observation": ""})
            thoughts, observed, final = [], label == FINAL, label == FINAL
            name = body if label == ACTION else None
    if thoughts:
        raise SkipRecord(EMPTY_ACTION, f"{key}: end", "the text ends with a Thought that no Action follows")
    if not turns:
        raise SkipRecord(NO_TURNS, key, "no Action or Final Answer in the text")
    return turns, question


def _action(name: str, arguments: str) -> Any:
    """A tool call when the input is a JSON object, else the action as the agent wrote it."""
    try:
        parsed = json.loads(arguments)
    except json.JSONDecodeError:
        parsed = None
    if isinstance(parsed, dict):
        return {"name": name, "arguments": parsed}
    return f"{name}\n{ACTION_INPUT}: {arguments}"
