"""ShareGPT / LLaMA-Factory records: `{"conversations": [{"from": ..., "value": ...}], "system": ...,
"tools": "<JSON list>"}` (the `role` / `content` spelling and a `messages` key are read too).

- `system` entries and the record's `system`: the system prompt (the record's first).
- `human` entries before the first assistant entry: the question; later ones join the observation
  of the turn before.
- `gpt` entry: a text action, reasoning from a `<think>` block opening it. A `gpt` entry directly
  followed by a `function_call` is what the model said before calling: the call turn's reasoning.
- `function_call` entry: a JSON object `{"name", "arguments"}` (or a list of them: parallel calls,
  one turn), optionally after a `<think>` block; `arguments` an object or a JSON string of one.
- `observation` entries: the call's result (several are joined in order; they name no call).
- `tools`: a list of JSON schemas, or a JSON string of one (LLaMA-Factory's form), kept as given.
"""

from __future__ import annotations

import json
from typing import Any

from race_core.importers.common import (
    MALFORMED_CALL,
    MALFORMED_MESSAGE,
    NO_QUESTION,
    NO_TURNS,
    Conversation,
    SkipRecord,
    TurnBuilder,
    joined,
    required_list,
    split_think,
    tool_call,
    tools_of,
)
from race_core.schema import WRONG_TYPE

NAME = "sharegpt"
USER, ASSISTANT, CALL, OBSERVATION, SYSTEM = "user", "assistant", "call", "observation", "system"
ROLES = {"human": USER, "user": USER, "gpt": ASSISTANT, "assistant": ASSISTANT, "chatgpt": ASSISTANT,
         "model": ASSISTANT, "function_call": CALL, "observation": OBSERVATION, "tool": OBSERVATION,
         "function": OBSERVATION, "system": SYSTEM}


def convert(record: dict[str, Any], source: str) -> Conversation:
    key = "conversations" if "conversations" in record else "messages"
    entries = required_list(record, key, "a list of {from, value} entries", missing_as="conversations")
    given_system = record.get("system")
    if given_system is not None and not isinstance(given_system, str):
        raise SkipRecord(WRONG_TYPE, "system", f"must be a string, got {type(given_system).__name__}")
    system = [(given_system or "").strip()]
    question: list[str] = []
    turns = TurnBuilder(result_per_call=False)
    said = ""  # a gpt entry's text, when a function_call entry follows it
    for i, entry in enumerate(entries):
        where = f"{key}[{i}]"
        role, text = _entry(entry, where)
        if role == SYSTEM:
            if turns.started:
                raise SkipRecord(MALFORMED_MESSAGE, where, "a system entry after the first assistant entry")
            system.append(text.strip())
        elif role == USER:
            if turns.started:
                turns.note(text)
            else:
                question.append(text.strip())
        elif role == ASSISTANT and i + 1 < len(entries) and _entry(entries[i + 1], f"{key}[{i + 1}]")[0] == CALL:
            said = text
        elif role == ASSISTANT:
            reasoning, rest = split_think(text, f"{where}.value")
            turns.step(reasoning, [], rest, where)
        elif role == CALL:
            said_reasoning, said_rest = split_think(said, f"{key}[{i - 1}].value")
            reasoning, payload = split_think(text, f"{where}.value")
            turns.step(joined([said_reasoning, said_rest, reasoning], "\n\n"), _calls(payload, where), "", where)
            said = ""
        else:
            turns.result(text, None, where)
    if not any(question):
        raise SkipRecord(NO_QUESTION, key, "no human entry before the first assistant entry")
    steps = turns.turns()
    if not steps:
        raise SkipRecord(NO_TURNS, key, "no gpt or function_call entry")
    return Conversation(question=joined(question, "\n\n"), turns=steps, system=joined(system, "\n\n"),
                        tools=tools_of(record.get("tools"), "tools"), consumed=(key, "system", "tools"))


def _entry(entry: Any, where: str) -> tuple[str, str]:
    """(role, text) of one entry, in either spelling."""
    if not isinstance(entry, dict):
        raise SkipRecord(MALFORMED_MESSAGE, where, f"must be an object, got {type(entry).__name__}")
    speaker = entry.get("from", entry.get("role"))
    if speaker not in ROLES:
        raise SkipRecord(MALFORMED_MESSAGE, f"{where}.from", f"unknown speaker {speaker!r}; known: {sorted(ROLES)}")
    value = entry.get("value", entry.get("content"))
    if not isinstance(value, str):
        raise SkipRecord(MALFORMED_MESSAGE, f"{where}.value", f"must be a string, got {type(value).__name__}")
    return ROLES[speaker], value


def _calls(payload: str, where: str) -> list[dict[str, Any]]:
    """The calls of a function_call entry's JSON: one object or a list of them."""
    try:
        parsed = json.loads(payload)
    except json.JSONDecodeError as exc:
        raise SkipRecord(MALFORMED_CALL, f"{where}.value", f"is not valid JSON: {exc.msg} at column {exc.colno}"
                         ) from None
    objects = parsed if isinstance(parsed, list) else [parsed]
    if not objects:
        raise SkipRecord(MALFORMED_CALL, f"{where}.value", "an empty list of calls")
    calls = []
    for k, call in enumerate(objects):
        at = f"{where}.value" + (f"[{k}]" if isinstance(parsed, list) else "")
        if not isinstance(call, dict):
            raise SkipRecord(MALFORMED_CALL, at, f"a call must be an object, got {type(call).__name__}")
        calls.append(tool_call(call.get("name"), call.get("arguments"), at))
    return calls
