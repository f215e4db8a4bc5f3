"""OpenAI chat logs: `{"messages": [...], "tools": [...]}` per record (the Chat Completions API's
request with the assistant's replies appended, as agent frameworks and fine-tuning files keep it).

- `system` / `developer` messages before the first assistant message: the system prompt.
- `user` messages before it: the question. Later user text joins the observation of the turn before.
- Each `assistant` message is one turn. Its reasoning: `reasoning_content` (DeepSeek, vLLM) or
  `reasoning` (OpenRouter), then a `<think>` block opening `content`. Its action: its `tool_calls`
  (`arguments` is a JSON string of an object; all the calls of one message are one turn, in call
  order), or the legacy `function_call`; without calls, the text of `content` after the think
  block. Text beside tool calls is what the model said before acting: it joins the reasoning.
- `tool` messages (`tool_call_id`) and legacy `function` messages: the results of the turn's calls,
  joined in call order whatever order they came in.
- `tools` (or the legacy `functions`): kept as the JSON schemas they are.
"""

from __future__ import annotations

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
    text_of,
    tool_call,
    tools_of,
)

NAME = "openai"
SYSTEM_ROLES = ("system", "developer")
REASONING_KEYS = ("reasoning_content", "reasoning")


def convert(record: dict[str, Any], source: str) -> Conversation:
    messages = required_list(record, "messages", "a list of chat messages")
    system: list[str] = []
    question: list[str] = []
    turns = TurnBuilder(result_per_call=True)
    for i, message in enumerate(messages):
        where = f"messages[{i}]"
        if not isinstance(message, dict):
            raise SkipRecord(MALFORMED_MESSAGE, where, f"must be an object, got {type(message).__name__}")
        role = message.get("role")
        text = text_of(message.get("content"), f"{where}.content")
        if role in SYSTEM_ROLES:
            if turns.started:
                raise SkipRecord(MALFORMED_MESSAGE, where, f"a {role} message after the first assistant message")
            system.append(text.strip())
        elif role == "user":
            if turns.started:
                turns.note(text)
            else:
                question.append(text.strip())
        elif role == "assistant":
            _assistant(message, text, where, turns)
        elif role == "tool":
            turns.result(text, message.get("tool_call_id"), where)
        elif role == "function":  # the legacy function-calling API: answers the turn's one call
            turns.result(text, None, where)
        else:
            raise SkipRecord(MALFORMED_MESSAGE, f"{where}.role", f"unknown role {role!r}")
    if not any(question):
        raise SkipRecord(NO_QUESTION, "messages", "no user message before the first assistant message")
    steps = turns.turns()
    if not steps:
        raise SkipRecord(NO_TURNS, "messages", "no assistant message")
    tools_key = "tools" if record.get("tools") is not None else "functions"
    return Conversation(question=joined(question, "\n\n"), turns=steps, system=joined(system, "\n\n"),
                        tools=tools_of(record.get(tools_key), tools_key),
                        consumed=("messages", "tools", "functions"))


def _assistant(message: dict[str, Any], text: str, where: str, turns: TurnBuilder) -> None:
    given = []
    for key in REASONING_KEYS:
        value = message.get(key)
        if value is not None and not isinstance(value, str):
            raise SkipRecord(MALFORMED_MESSAGE, f"{where}.{key}", f"must be a string, got {type(value).__name__}")
        given.append((value or "").strip())
    inline, rest = split_think(text, f"{where}.content")
    calls = _calls(message, where)
    # the first reasoning field that has text: servers that fill both fill them with the same text
    reasoning = joined([next((g for g in given if g), ""), inline, rest if calls else ""], "\n\n")
    turns.step(reasoning, calls, "" if calls else rest, where)


def _calls(message: dict[str, Any], where: str) -> list[dict[str, Any]]:
    raw = message.get("tool_calls")
    if raw is None:
        raw = []
    if not isinstance(raw, list):
        raise SkipRecord(MALFORMED_CALL, f"{where}.tool_calls", f"must be a list, got {type(raw).__name__}")
    calls = []
    for k, call in enumerate(raw):
        at = f"{where}.tool_calls[{k}]"
        if not isinstance(call, dict):
            raise SkipRecord(MALFORMED_CALL, at, f"must be an object, got {type(call).__name__}")
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
