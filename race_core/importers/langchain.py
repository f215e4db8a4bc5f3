"""LangChain / LangGraph message dumps and LangSmith run exports.

A record is `{"messages": [...]}` (a LangGraph state, or `messages_to_dict` output wrapped in an
object), or a LangSmith run, `{"inputs": {"messages": [...]}, "outputs": {...}, "status": ...}`:
its conversation is the input messages (a list, or a batch: a list of lists, whose first is read)
followed by the output's `messages` (left alone when they repeat the inputs: a LangGraph state
holds the whole conversation), or the first of its `generations` (a chat model run), or its
`output` message.

A message may be in any of LangChain's serialized forms: `message_to_dict`'s `{"type": "ai",
"data": {...}}`, `dumpd`'s `{"lc": 1, "type": "constructor", "id": [..., "AIMessage"], "kwargs":
{...}}`, a plain `model_dump()` (`{"type": "ai", "content": ...}`), or an OpenAI-style `{"role",
"content"}` dict. Types: `human` (the question, later user text), `system`, `ai` (a step), `tool`
(a result, by `tool_call_id`), `function`, `chat` (by its `role`). An `ai` message's calls are its
`tool_calls` (`{"name", "args", "id"}`), else `additional_kwargs.tool_calls` (OpenAI's form), else
its `tool_use` / `tool_call` content blocks; an `invalid_tool_calls` entry skips the record
(`malformed_call`, with LangChain's error). Reasoning: `additional_kwargs.reasoning_content` and
`thinking` / `reasoning` content blocks. Text is read like any assistant text (`chat`).

A run whose `status` is "error" (or that has an `error`) did not succeed; a successful status says
nothing about the task, so such a run needs a success flag or `--assume-successful`. The tools'
schemas: the record's `tools`, else the run's `extra.invocation_params.tools`.
"""

from __future__ import annotations

from typing import Any

from race_core.importers import openai
from race_core.importers.chat import ASSISTANT, SYSTEM, TOOL, USER, Message, chat_turns
from race_core.importers.common import (
    MALFORMED_CALL,
    MALFORMED_MESSAGE,
    Conversation,
    SkipRecord,
    call_objects,
    joined,
    parts_of,
    tool_call,
    tools_of,
)
from race_core.schema import MISSING_FIELD

NAME = "langchain"
TYPES = {"human": USER, "user": USER, "ai": ASSISTANT, "assistant": ASSISTANT, "system": SYSTEM, "developer": SYSTEM,
         "tool": TOOL, "function": TOOL}
CLASSES = {"HumanMessage": "human", "AIMessage": "ai", "SystemMessage": "system", "ToolMessage": "tool",
           "FunctionMessage": "function", "ChatMessage": "chat"}
CALL_BLOCKS = ("tool_use", "tool_call")  # Anthropic's and LangChain's standard call blocks


def matches(record: dict[str, Any]) -> bool:
    """LangChain-serialized `messages`, or a LangSmith run (`inputs` and `outputs` objects)."""
    if isinstance(record.get("inputs"), dict) and isinstance(record.get("outputs"), dict):
        return True
    messages = record.get("messages")
    first = messages[0] if isinstance(messages, list) and messages else None
    return isinstance(first, dict) and ("lc" in first or (first.get("type") in (*TYPES, "chat")
                                                           and "role" not in first))


def success(record: dict[str, Any]) -> tuple[bool, str, Any] | None:
    """A LangSmith run that raised did not succeed; None otherwise (see the module docstring)."""
    if record.get("error"):
        return False, "error", record["error"]
    status = record.get("status")
    return (False, "status", status) if status == "error" else None


def convert(record: dict[str, Any], source: str) -> Conversation:
    if "inputs" in record or "outputs" in record:
        messages, consumed = _run_messages(record), ("inputs", "outputs", "tools")
    else:
        raw = record.get("messages")
        if raw is None:
            raise SkipRecord(MISSING_FIELD, "messages", "is required (a list of LangChain messages), or a LangSmith "
                                                        "run's inputs / outputs")
        messages, consumed = _messages(raw, "messages"), ("messages", "tools")
    chat = chat_turns(messages, "messages")
    tools = record.get("tools")
    where = "tools"
    if tools is None:
        extra = record.get("extra")
        params = extra.get("invocation_params") if isinstance(extra, dict) else None
        tools, where = (params.get("tools") if isinstance(params, dict) else None), "extra.invocation_params.tools"
    return Conversation(question=chat.question, turns=chat.turns, system=chat.system, tools=tools_of(tools, where),
                        consumed=consumed)


def _run_messages(record: dict[str, Any]) -> list[Message]:
    inputs, outputs = record.get("inputs"), record.get("outputs")
    if not isinstance(inputs, dict) or "messages" not in inputs:
        raise SkipRecord(MISSING_FIELD, "inputs.messages", "is required: the run's input messages")
    raw = inputs["messages"]
    where = "inputs.messages"
    if isinstance(raw, list) and raw and isinstance(raw[0], list):  # a chat model run: a batch of prompts
        raw, where = raw[0], "inputs.messages[0]"
    given = _messages(raw, where)
    if not isinstance(outputs, dict):
        return given
    if outputs.get("messages") is not None:
        out = _messages(outputs["messages"], "outputs.messages")
        repeats = len(out) >= len(given) and all(_same(a, b) for a, b in zip(given, out, strict=False))
        return out if repeats else given + out
    generations = outputs.get("generations")
    if generations is not None:
        first = generations[0] if isinstance(generations, list) and generations else None
        first = first[0] if isinstance(first, list) and first else first
        if not isinstance(first, dict) or not isinstance(first.get("message"), dict):
            raise SkipRecord(MALFORMED_MESSAGE, "outputs.generations", "must hold a generation with its message")
        return given + [_message(first["message"], "outputs.generations[0][0].message")]
    if isinstance(outputs.get("output"), dict):
        return given + [_message(outputs["output"], "outputs.output")]
    return given


def _same(a: Message, b: Message) -> bool:
    return (a.role, a.text, a.reasoning, a.calls, a.call_id) == (b.role, b.text, b.reasoning, b.calls, b.call_id)


def _messages(raw: Any, where: str) -> list[Message]:
    if not isinstance(raw, list):
        raise SkipRecord(MALFORMED_MESSAGE, where, f"must be a list of messages, got {type(raw).__name__}")
    return [_message(m, f"{where}[{i}]") for i, m in enumerate(raw)]


def _message(message: Any, where: str) -> Message:
    if not isinstance(message, dict):
        raise SkipRecord(MALFORMED_MESSAGE, where, f"must be an object, got {type(message).__name__}")
    kind, fields = _form(message, where)
    if kind is None:
        return openai.message_of(message, where)
    if kind == "chat":
        kind = fields.get("role")
    role = TYPES.get(kind)
    if role is None:
        raise SkipRecord(MALFORMED_MESSAGE, f"{where}.type", f"unknown message type {kind!r}; known: {sorted(TYPES)}")
    at = f"{where}.content"
    content, block_calls = _blocks(fields.get("content"), at)
    parts = parts_of(content, at)
    if role != ASSISTANT:
        return Message(role, where, parts.text, call_id=fields.get("tool_call_id"))
    extra_fields = fields.get("additional_kwargs") or {}
    if not isinstance(extra_fields, dict):
        raise SkipRecord(MALFORMED_MESSAGE, f"{where}.additional_kwargs", "must be an object")
    given = extra_fields.get("reasoning_content")
    reasoning = joined([given.strip() if isinstance(given, str) else "", parts.reasoning], "\n\n")
    return Message(ASSISTANT, where, parts.text, reasoning, _calls(fields, extra_fields, block_calls, where))


def _form(message: dict[str, Any], where: str) -> tuple[str | None, dict[str, Any]]:
    """(the message's type, its fields) in whichever serialized form it is; (None, {}) for an
    OpenAI-style message."""
    if "lc" in message:
        ids, kwargs = message.get("id"), message.get("kwargs")
        name = ids[-1] if isinstance(ids, list) and ids and isinstance(ids[-1], str) else None
        kind = CLASSES.get(name.removesuffix("Chunk")) if name else None
        if kind is None or not isinstance(kwargs, dict):
            raise SkipRecord(MALFORMED_MESSAGE, f"{where}.id", f"not a serialized LangChain message: {ids!r}")
        return kind, kwargs
    if isinstance(message.get("data"), dict) and "type" in message:
        return message["type"], message["data"]
    if "type" in message:
        return message["type"], message
    if "role" in message:
        return None, {}
    raise SkipRecord(MALFORMED_MESSAGE, where, "not a LangChain message: no 'type' (nor 'lc' or 'role')")


def _blocks(content: Any, where: str) -> tuple[Any, list[dict[str, Any]]]:
    """The content without its call blocks (and with OpenAI reasoning summaries as text), and the
    calls those blocks hold."""
    if not isinstance(content, list):
        return content, []
    kept, calls = [], []
    for k, block in enumerate(content):
        kind = block.get("type") if isinstance(block, dict) else None
        if kind in CALL_BLOCKS and "value" not in block:
            arguments = block.get("input") if kind == "tool_use" else block.get("args")
            calls.append(tool_call(block.get("name"), arguments, f"{where}[{k}]", block.get("id")))
        elif kind == "reasoning" and isinstance(block.get("summary"), list):
            summary = parts_of(block["summary"], f"{where}[{k}].summary").reasoning
            kept.append({"type": "reasoning", "reasoning": summary})
        else:
            kept.append(block)
    return kept, calls


def _calls(fields: dict[str, Any], extra_fields: dict[str, Any], block_calls: list[dict[str, Any]],
           where: str) -> list[dict[str, Any]]:
    invalid = fields.get("invalid_tool_calls") or []
    if invalid:
        first = invalid[0] if isinstance(invalid[0], dict) else {}
        raise SkipRecord(MALFORMED_CALL, f"{where}.invalid_tool_calls[0]",
                         f"LangChain could not parse the call {first.get('name')!r}: {first.get('error')}")
    calls = [tool_call(call.get("name"), call.get("args"), at, call.get("id"))
             for at, call in call_objects(fields.get("tool_calls"), f"{where}.tool_calls")]
    if calls:
        return calls
    native = openai.calls_of(extra_fields, f"{where}.additional_kwargs")
    return native or block_calls

