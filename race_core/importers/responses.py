"""OpenAI Responses API logs: a record with the conversation's items, `{"input": [...], "output": [...],
"instructions": ..., "tools": [...]}` (a request with its response's output appended, or a stored
response object with the input items it was given; `input` may also be the user's text).

Items, in order (each becomes a `chat.Message`; see `race_core.importers.chat` for the turns):
- `message` (or a bare `{"role", "content"}`): `system` / `developer` the system prompt, `user`
  the question or later user text, `assistant` (`output_text` parts) a text step, read for ReAct
  labels and Hermes blocks like any assistant text.
- `reasoning`: the reasoning of the next assistant step: its `content` (`reasoning_text` parts),
  else its `summary` (`summary_text` parts). Encrypted content, and a summary beside the content,
  go to `extra` (`reasoning_items`, with the item's id).
- `function_call` (`name`, `arguments` a JSON string, `call_id`): a tool call; consecutive calls
  are one step (parallel calls). Assistant text right before them is what the model said before
  acting: their reasoning.
- `function_call_output` (`call_id`, `output` a string or a list of text parts): the result.
- `instructions`: the system prompt, before any system message. `tools`: the function tools' schemas
  (`{"type": "function", "name", "parameters"}`); hosted tools (web search, file search, ...) have
  no schema to render and go to `extra` (`hosted_tools`). Other item types cannot be imported.
"""

from __future__ import annotations

from typing import Any

from race_core.importers.chat import ASSISTANT, SYSTEM, TOOL, USER, Message, chat_turns
from race_core.importers.common import (
    MALFORMED_MESSAGE,
    Conversation,
    SkipRecord,
    joined,
    parts_of,
    text_of,
    tool_call,
    tools_of,
)
from race_core.schema import MISSING_FIELD

NAME = "responses"
ITEM_TYPES = ("message", "reasoning", "function_call", "function_call_output")
ROLES = {"system": SYSTEM, "developer": SYSTEM, "user": USER, "assistant": ASSISTANT}


def matches(record: dict[str, Any]) -> bool:
    """A response object, or `input` / `output` lists of typed items."""
    if record.get("object") == "response":
        return True
    items = [i for key in ("input", "output") if isinstance(record.get(key), list) for i in record[key]]
    return any(isinstance(i, dict) and i.get("type") in ITEM_TYPES for i in items)


def convert(record: dict[str, Any], source: str) -> Conversation:
    items = _items(record)
    extra: dict[str, Any] = {}
    instructions = record.get("instructions")
    messages = [Message(SYSTEM, "instructions", text_of(instructions, "instructions"))] if instructions else []
    pending = ""  # a reasoning item's text, until the step it belongs to
    for where, item in items:
        kind = item.get("type", "message")
        if kind == "reasoning":
            pending = joined([pending, _reasoning(item, where, extra)], "\n\n")
        elif kind == "function_call":
            call = tool_call(item.get("name"), item.get("arguments"), where, item.get("call_id"))
            last = messages[-1] if messages else None
            if last is not None and last.role == ASSISTANT and last.calls and not pending:
                last.calls.append(call)  # a parallel call of the same step
            else:
                messages.append(Message(ASSISTANT, where, "", pending, [call]))
                pending = ""
        elif kind == "function_call_output":
            messages.append(Message(TOOL, where, text_of(item.get("output"), f"{where}.output"),
                                    call_id=item.get("call_id")))
        elif kind == "message":
            role = ROLES.get(item.get("role"))
            if role is None:
                raise SkipRecord(MALFORMED_MESSAGE, f"{where}.role", f"unknown role {item.get('role')!r}; known: "
                                                                     f"{sorted(ROLES)}")
            parts = parts_of(item.get("content"), f"{where}.content")
            messages.append(Message(role, where, parts.text, joined([pending, parts.reasoning], "\n\n")
                                    if role == ASSISTANT else ""))
            pending = "" if role == ASSISTANT else pending
        else:
            raise SkipRecord(MALFORMED_MESSAGE, f"{where}.type", f"item type {kind!r} cannot be imported; known: "
                                                                 f"{list(ITEM_TYPES)}")
    chat = chat_turns(messages, "input")
    function_tools, hosted = _tools(record.get("tools"))
    if hosted:
        extra["hosted_tools"] = hosted
    return Conversation(question=chat.question, turns=chat.turns, system=chat.system, tools=function_tools,
                        consumed=("input", "output", "instructions", "tools"), extra=extra)


def _items(record: dict[str, Any]) -> list[tuple[str, dict[str, Any]]]:
    """(where, item) for each input item, then each output item."""
    items: list[tuple[str, dict[str, Any]]] = []
    given = record.get("input")
    if isinstance(given, str):
        items.append(("input", {"type": "message", "role": "user", "content": given}))
    elif given is not None and not isinstance(given, list):
        raise SkipRecord(MALFORMED_MESSAGE, "input", f"must be a string or a list of items, got {type(given).__name__}")
    for key in ("input", "output"):
        value = record.get(key)
        if key == "output" and value is not None and not isinstance(value, list):
            raise SkipRecord(MALFORMED_MESSAGE, key, f"must be a list of items, got {type(value).__name__}")
        for k, item in enumerate(value if isinstance(value, list) else []):
            if not isinstance(item, dict):
                raise SkipRecord(MALFORMED_MESSAGE, f"{key}[{k}]", f"must be an object, got {type(item).__name__}")
            items.append((f"{key}[{k}]", item))
    if not items:
        raise SkipRecord(MISSING_FIELD, "input", "is required (the conversation's items; `output` with them)")
    return items


def _reasoning(item: dict[str, Any], where: str, extra: dict[str, Any]) -> str:
    """The text of a reasoning item; what is not used of it goes to `extra["reasoning_items"]`."""
    content = parts_of(item.get("content"), f"{where}.content").reasoning
    summary = parts_of(item.get("summary"), f"{where}.summary").reasoning
    unused = {k: item[k] for k in ("encrypted_content",) if item.get(k)}
    if content and summary:
        unused["summary"] = item["summary"]
    if unused:
        extra.setdefault("reasoning_items", []).append({"id": item.get("id"), **unused})
    return content or summary


def _tools(value: Any) -> tuple[list[Any] | None, list[Any]]:
    """(the function tools, the hosted ones) of `tools`."""
    tools = tools_of(value, "tools") or []
    functions = [t for t in tools if t.get("type", "function") == "function"]
    return functions or None, [t for t in tools if t.get("type", "function") != "function"]
