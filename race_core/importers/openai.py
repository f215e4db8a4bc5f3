"""OpenAI chat logs: `{"messages": [...], "tools": [...]}` per record (the Chat Completions API's
request with the assistant's replies appended, as agent frameworks and fine-tuning files keep it).

Each message becomes a `chat.Message` (see `race_core.importers.chat` for how turns are made):
- `system` / `developer`: the system prompt; `user`: the question, later results or user text.
- `assistant`: reasoning from `reasoning_content` (DeepSeek, vLLM) or `reasoning` (OpenRouter) and
  from reasoning parts of `content`; calls from `tool_calls` (`arguments` a JSON string of an
  object, also one encoded twice; the calls of one message are one turn, in call order) or the
  legacy `function_call`. Without calls, the text is read for Hermes `<tool_call>` blocks and
  ReAct `Thought:` / `Action:` labels.
- `tool` messages (`tool_call_id`) and legacy `function` messages: the results of the turn's calls,
  joined in call order whatever order they came in.
- `tools` (or the legacy `functions`): kept as the JSON schemas they are.
"""

from __future__ import annotations

from typing import Any

from race_core.importers.chat import ASSISTANT, SYSTEM, TOOL, USER, Message, chat_turns
from race_core.importers.common import (
    MALFORMED_CALL,
    MALFORMED_MESSAGE,
    Conversation,
    SkipRecord,
    call_objects,
    joined,
    parts_of,
    required_list,
    tool_call,
    tools_of,
)

NAME = "openai"
ROLES = {"system": SYSTEM, "developer": SYSTEM, "user": USER, "assistant": ASSISTANT, "tool": TOOL, "function": TOOL}
REASONING_KEYS = ("reasoning_content", "reasoning")


def matches(record: dict[str, Any]) -> bool:
    """A `messages` list of `role` / `content` messages."""
    messages = record.get("messages")
    first = messages[0] if isinstance(messages, list) and messages else None
    return isinstance(first, dict) and "role" in first and not _typed_parts(first.get("content"))


def _typed_parts(content: Any) -> bool:
    return isinstance(content, list) and any(isinstance(p, dict) and "value" in p for p in content)


def convert(record: dict[str, Any], source: str) -> Conversation:
    messages = required_list(record, "messages", "a list of chat messages")
    chat = chat_turns([message_of(m, f"messages[{i}]") for i, m in enumerate(messages)], "messages")
    tools_key = "tools" if record.get("tools") is not None else "functions"
    return Conversation(question=chat.question, turns=chat.turns, system=chat.system,
                        tools=tools_of(record.get(tools_key), tools_key), consumed=("messages", "tools", "functions"))


def message_of(message: Any, where: str) -> Message:
    """One chat message (a dict with `role`) as a `chat.Message`."""
    if not isinstance(message, dict):
        raise SkipRecord(MALFORMED_MESSAGE, where, f"must be an object, got {type(message).__name__}")
    role = message.get("role")
    if role not in ROLES:
        raise SkipRecord(MALFORMED_MESSAGE, f"{where}.role", f"unknown role {role!r}; known: {sorted(ROLES)}")
    parts = parts_of(message.get("content"), f"{where}.content")
    if ROLES[role] != ASSISTANT:
        if parts.reasoning or parts.calls:
            raise SkipRecord(MALFORMED_MESSAGE, f"{where}.content", f"reasoning or tool_call parts in a {role} message")
        return Message(ROLES[role], where, parts.text, call_id=message.get("tool_call_id"))
    given = []
    for key in REASONING_KEYS:
        value = message.get(key)
        if value is not None and not isinstance(value, str):
            raise SkipRecord(MALFORMED_MESSAGE, f"{where}.{key}", f"must be a string, got {type(value).__name__}")
        given.append((value or "").strip())
    # the first reasoning field that has text: servers that fill both fill them with the same text
    reasoning = joined([next((g for g in given if g), ""), parts.reasoning], "\n\n")
    return Message(ASSISTANT, where, parts.text, reasoning, parts.calls + calls_of(message, where))


def calls_of(message: dict[str, Any], where: str) -> list[dict[str, Any]]:
    """The calls of an assistant message: `tool_calls` in OpenAI's form, or the legacy `function_call`."""
    calls = []
    for at, call in call_objects(message.get("tool_calls"), f"{where}.tool_calls"):
        kind = call.get("type", "function")
        if kind != "function":
            raise SkipRecord(MALFORMED_CALL, f"{at}.type", f"only function calls can be imported, got {kind!r}")
        function = call.get("function")
        if not isinstance(function, dict):
            raise SkipRecord(MALFORMED_CALL, f"{at}.function", "must be an object with name and arguments")
        parsed = tool_call(function.get("name"), function.get("arguments"), f"{at}.function")
        call_id = call.get("id")
        if call_id is not None and not isinstance(call_id, str):
            raise SkipRecord(MALFORMED_CALL, f"{at}.id", f"must be a string, got {type(call_id).__name__}")
        if call_id:  # kept with the call: the contract's place for the source's call id
            parsed["id"] = call_id
        calls.append(parsed)
    legacy = message.get("function_call")
    if legacy is not None:
        at = f"{where}.function_call"
        if calls or not isinstance(legacy, dict):
            raise SkipRecord(MALFORMED_CALL, at, "must be one object with name and arguments, and not beside "
                                                 "tool_calls")
        calls.append(tool_call(legacy.get("name"), legacy.get("arguments"), at))
    return calls
