"""ShareGPT / LLaMA-Factory records: `{"conversations": [{"from": ..., "value": ...}], "system": ...,
"tools": "<JSON list>"}` (the `role` / `content` spelling and a `messages` key are read too), and
LLaMA-Factory's typed-parts records, whose `content` is a list of `{"type": "text" | "reasoning" |
"tool_call", "value": ...}` parts.

Each entry becomes a `chat.Message` (see `race_core.importers.chat` for how turns are made):
- `system` entries and the record's `system`: the system prompt (the record's first).
- `human` / `user`: the question, later user text (or results, see `chat`).
- `gpt` / `assistant`: its text is read for a `<think>` block, Hermes `<tool_call>` blocks and
  ReAct labels; a `gpt` entry directly followed by a `function_call` is what the model said before
  calling: the call turn's reasoning.
- `function_call` / `function-call`: a JSON object `{"name", "arguments"}` (or a list of them:
  parallel calls, one turn), optionally after a `<think>` block; `arguments` an object or a JSON
  string of one (Glaive's single-quoted one too).
- `observation` / `function` / `tool` / `function-response` / `function_response`: a result (several
  are joined in order; they name no call; Hermes `<tool_response>` blocks are one result each).
- `tools`: a list of JSON schemas, or a JSON string of one (LLaMA-Factory's form), kept as given.
"""

from __future__ import annotations

from typing import Any

from race_core.importers.chat import ASSISTANT, SYSTEM, TOOL, USER, Message, chat_turns
from race_core.importers.common import (
    MALFORMED_MESSAGE,
    Conversation,
    SkipRecord,
    calls_from_json,
    joined,
    parts_of,
    required_list,
    split_think,
    tools_of,
)
from race_core.schema import WRONG_TYPE

NAME = "sharegpt"
CALL = "call"
ROLES = {"human": USER, "user": USER, "gpt": ASSISTANT, "assistant": ASSISTANT, "chatgpt": ASSISTANT,
         "model": ASSISTANT, "function_call": CALL, "function-call": CALL, "observation": TOOL, "tool": TOOL,
         "function": TOOL, "function-response": TOOL, "function_response": TOOL, "system": SYSTEM}


def matches(record: dict[str, Any]) -> bool:
    """`conversations`, or `messages` of `from` / `value` entries or of LLaMA-Factory's typed parts."""
    if isinstance(record.get("conversations"), list):
        return True
    messages = record.get("messages")
    first = messages[0] if isinstance(messages, list) and messages else None
    content = first.get("content") if isinstance(first, dict) else None
    return isinstance(first, dict) and ("from" in first or (isinstance(content, list) and any(
        isinstance(p, dict) and "value" in p for p in content)))


def convert(record: dict[str, Any], source: str) -> Conversation:
    key = "conversations" if "conversations" in record else "messages"
    entries = required_list(record, key, "a list of {from, value} entries", missing_as="conversations")
    given_system = record.get("system")
    if given_system is not None and not isinstance(given_system, str):
        raise SkipRecord(WRONG_TYPE, "system", f"must be a string, got {type(given_system).__name__}")
    messages = [Message(SYSTEM, "system", given_system)] if given_system else []
    messages += [_message(entry, f"{key}[{i}]") for i, entry in enumerate(entries)]
    chat = chat_turns(messages, key, result_per_call=False)
    return Conversation(question=chat.question, turns=chat.turns, system=chat.system,
                        tools=tools_of(record.get("tools"), "tools"), consumed=(key, "system", "tools"))


def _message(entry: Any, where: str) -> Message:
    """One entry, in either spelling, as a `chat.Message`."""
    if not isinstance(entry, dict):
        raise SkipRecord(MALFORMED_MESSAGE, where, f"must be an object, got {type(entry).__name__}")
    speaker_key = "from" if "from" in entry else "role"
    speaker = entry.get(speaker_key)
    if speaker not in ROLES:
        raise SkipRecord(MALFORMED_MESSAGE, f"{where}.{speaker_key}", f"unknown speaker {speaker!r}; known: "
                                                                      f"{sorted(ROLES)}")
    value_key = "value" if "value" in entry else "content"
    parts = parts_of(entry.get(value_key), f"{where}.{value_key}")
    role = ROLES[speaker]
    if role == CALL:
        reasoning, payload = split_think(parts.text, f"{where}.{value_key}")
        calls = calls_from_json(payload, f"{where}.{value_key}")
        return Message(ASSISTANT, where, "", joined([parts.reasoning, reasoning], "\n\n"), parts.calls + calls)
    if (parts.reasoning or parts.calls) and role != ASSISTANT:
        raise SkipRecord(MALFORMED_MESSAGE, f"{where}.{value_key}",
                         f"reasoning or tool_call parts in a {speaker} entry")
    return Message(role, where, parts.text, parts.reasoning, parts.calls)
