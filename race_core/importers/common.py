"""What every importer shares: the reasons a record is skipped, the success rule, the text of a
message, `<think>` blocks, tool-call arguments, and the assembly of turns from messages.

A format module turns one source record into a `Conversation` (question, system, tools, turns) or
raises `SkipRecord` naming the bad field; `race_core.importers` adds what every record gets
(environment, source revision, the source's ids) and validates the result with the contract.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from typing import Any

from race_core.schema import BAD_SPLIT, BAD_TOOLS, EMPTY_ACTION, MISSING_FIELD, NOT_OBJECT, NOT_SUCCESSFUL

# Reasons a record is skipped (with the contract's own codes: not_json, line_too_long, bad_split, ...).
NO_SUCCESS_FLAG = "no_success_flag"  # the record says nothing about success and --assume-successful is off
BAD_SUCCESS_FLAG = "bad_success_flag"  # a success field of the wrong type
NO_QUESTION = "no_question"  # no user message (or Question) to take the question from
NO_TURNS = "no_turns"  # no assistant step at all
MALFORMED_MESSAGE = "malformed_message"  # a message or step that is not what its format says
MALFORMED_CALL = "malformed_call"  # a tool call without a name, arguments that are not a JSON object, ...
MISSING_OBSERVATION = "missing_observation"  # a call before the last turn without its result
ORPHAN_OBSERVATION = "orphan_observation"  # a result that answers no call of the turn before it
SKIP_CODES = (NOT_OBJECT, NOT_SUCCESSFUL, NO_SUCCESS_FLAG, BAD_SUCCESS_FLAG, BAD_SPLIT, MISSING_FIELD, NO_QUESTION,
              NO_TURNS, EMPTY_ACTION, MALFORMED_MESSAGE, MALFORMED_CALL, MISSING_OBSERVATION, ORPHAN_OBSERVATION,
              BAD_TOOLS)

SUCCESS_KEYS = ("successful", "success", "resolved")  # booleans, in this order of precedence
REWARD_KEY = "reward"  # a number: success when >= MIN_REWARD
MIN_REWARD = 1.0
OBSERVATION_JOIN = "\n\n"  # between the results of a turn's calls, and any user text after them


class SkipRecord(ValueError):
    """A source record that cannot become a trajectory: `.code` says why, `.field` where."""

    def __init__(self, code: str, field: str, message: str):
        super().__init__(f"{field}: {message} [{code}]")
        self.code = code
        self.field = field
        self.message = message


@dataclass
class Conversation:
    """What a format module reads from one record, before the fields every record gets."""

    question: str
    turns: list[dict[str, Any]]
    system: str = ""
    tools: list[Any] | None = None
    consumed: tuple[str, ...] = ()  # record keys read into the fields above (the rest go to `extra`)
    extra: dict[str, Any] = field(default_factory=dict)  # the source's identifiers found on the way


def required_list(record: dict[str, Any], key: str, what: str, missing_as: str | None = None) -> list[Any]:
    """`record[key]`, which must be a list (`what` it holds, for the message); `missing_as` names the
    field in the message when it is absent (the format's usual key, where it reads another too)."""
    value = record.get(key)
    if value is None:
        raise SkipRecord(MISSING_FIELD, missing_as or key, f"is required ({what})")
    if not isinstance(value, list):
        raise SkipRecord(MALFORMED_MESSAGE, key, f"must be a list, got {type(value).__name__}")
    return value


def success_flag(record: dict[str, Any]) -> tuple[bool, str, Any] | None:
    """The record's own word on success, as (successful, the field that says so, its value): a
    boolean `successful` / `success` / `resolved`, else a numeric `reward` (success when >= 1);
    None when it has none of them (the format may know more)."""
    for key in SUCCESS_KEYS:
        value = record.get(key)
        if value is None:
            continue
        if not isinstance(value, bool):
            raise SkipRecord(BAD_SUCCESS_FLAG, key, f"must be true or false, got {value!r}")
        return value, key, value
    reward = record.get(REWARD_KEY)
    if reward is None:
        return None
    if isinstance(reward, bool) or not isinstance(reward, (int, float)) or not math.isfinite(reward):
        raise SkipRecord(BAD_SUCCESS_FLAG, REWARD_KEY, f"must be a finite number, got {reward!r}")
    return reward >= MIN_REWARD, REWARD_KEY, reward


def text_of(content: Any, where: str) -> str:
    """A message's text: a string, null (no text), or a list of text parts (OpenAI content parts,
    joined with newlines). Any other part (an image, audio) cannot be a trajectory's text."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        raise SkipRecord(MALFORMED_MESSAGE, where, f"must be a string or a list of text parts, "
                                                   f"got {type(content).__name__}")
    texts = []
    for k, part in enumerate(content):
        if isinstance(part, str):
            texts.append(part)
            continue
        kind = part.get("type") if isinstance(part, dict) else None
        text = part.get("text") if isinstance(part, dict) else None
        if kind not in ("text", "input_text", "output_text") or not isinstance(text, str):
            raise SkipRecord(MALFORMED_MESSAGE, f"{where}[{k}]", f"only text parts can be imported, got "
                                                               f"{kind if kind else type(part).__name__!r}")
        texts.append(text)
    return "\n".join(texts)


OPEN_THINK, CLOSE_THINK = "<think>", "</think>"


def split_think(text: str, where: str) -> tuple[str, str]:
    """(reasoning, the rest) of an assistant text that opens with a `<think>...</think>` block, or
    that holds only its closing tag (the opening one was in the prompt, as with DeepSeek-R1 and
    Qwen3 logs). Both parts are stripped; text without a think block is all rest."""
    body = text.lstrip()
    if body.startswith(OPEN_THINK):
        end = body.find(CLOSE_THINK)
        if end < 0:
            raise SkipRecord(MALFORMED_MESSAGE, where, f"{OPEN_THINK} is never closed by {CLOSE_THINK}")
        return body[len(OPEN_THINK):end].strip(), body[end + len(CLOSE_THINK):].strip()
    end = body.find(CLOSE_THINK)
    if end >= 0 and OPEN_THINK not in body[:end]:
        return body[:end].strip(), body[end + len(CLOSE_THINK):].strip()
    return "", text.strip()


def joined(parts: list[str], sep: str) -> str:
    """The non-empty parts joined with `sep`."""
    return sep.join(p for p in parts if p)


def arguments_of(value: Any, where: str) -> dict[str, Any]:
    """A call's arguments: an object, or a JSON string of one (OpenAI's form). Missing, null or an
    empty string is a call without arguments."""
    if value is None or (isinstance(value, str) and not value.strip()):
        return {}
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except json.JSONDecodeError as exc:
            raise SkipRecord(MALFORMED_CALL, where, f"is not valid JSON: {exc.msg} at column {exc.colno}") from None
    if not isinstance(value, dict):
        raise SkipRecord(MALFORMED_CALL, where, f"must be a JSON object, got {type(value).__name__}")
    return value


def tool_call(name: Any, arguments: Any, where: str) -> dict[str, Any]:
    """One call in the contract's form, `{"name", "arguments"}`."""
    if not isinstance(name, str) or not name.strip():
        raise SkipRecord(MALFORMED_CALL, f"{where}.name", f"must be a non-empty string, got {name!r}")
    return {"name": name, "arguments": arguments_of(arguments, f"{where}.arguments")}


def tools_of(value: Any, where: str) -> list[Any] | None:
    """The tools' JSON schemas: a list (or a JSON string of one, as LLaMA-Factory stores them);
    absent, null or "" is none. The schemas are kept as the source gave them."""
    if value is None or (isinstance(value, str) and not value.strip()):
        return None
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except json.JSONDecodeError as exc:
            raise SkipRecord(BAD_TOOLS, where, f"is not valid JSON: {exc.msg} at column {exc.colno}") from None
    if not isinstance(value, list) or not all(isinstance(tool, dict) for tool in value):
        raise SkipRecord(BAD_TOOLS, where, "must be a list of JSON-schema objects")
    return value or None


@dataclass
class _OpenTurn:
    reasoning: str
    action: Any
    calls: list[dict[str, Any]]
    where: str
    results: dict[int, str] = field(default_factory=dict)  # call index -> its result
    notes: list[str] = field(default_factory=list)  # user text after the assistant message


class TurnBuilder:
    """Turns from a message list: each assistant step opens a turn; the results of its calls (in
    call order, whatever order they came in) and then any user text before the next step make its
    observation. A call before the last turn must have its result: a log that lost it is skipped
    rather than trained on with a made-up empty observation. `result_per_call=False`: the source's
    results name no call (ShareGPT), and a calling turn needs at least one."""

    def __init__(self, result_per_call: bool = True):
        self.result_per_call = result_per_call
        self._done: list[dict[str, Any]] = []
        self._open: _OpenTurn | None = None

    @property
    def started(self) -> bool:
        return self._open is not None

    def step(self, reasoning: str, calls: list[dict[str, Any]], text: str, where: str) -> None:
        """An assistant step: its calls (parallel calls stay one turn), or else the text action."""
        if calls:
            ids = [c["id"] for c in calls if "id" in c]
            if len(ids) != len(set(ids)):
                raise SkipRecord(MALFORMED_CALL, where, f"two calls of one message share an id: {ids}")
            action: Any = calls[0] if len(calls) == 1 else calls
        elif text.strip():
            action = text.strip()
        else:
            raise SkipRecord(EMPTY_ACTION, where, "an assistant step with neither a tool call nor text")
        self._close()
        self._open = _OpenTurn(reasoning, action, calls, where)

    def result(self, text: str, call_id: Any, where: str) -> None:
        """A tool result: for the call with `call_id`, or (no id) the first call not yet answered."""
        turn = self._open
        if turn is None or not turn.calls:
            raise SkipRecord(ORPHAN_OBSERVATION, where, "a tool result with no tool call before it")
        if not self.result_per_call:
            turn.results[len(turn.results)] = text
            return
        if call_id is not None and not isinstance(call_id, str):
            raise SkipRecord(MALFORMED_MESSAGE, f"{where}.tool_call_id", f"must be a string, got {call_id!r}")
        if call_id:
            index = next((k for k, c in enumerate(turn.calls) if c.get("id") == call_id), None)
            if index is None:
                raise SkipRecord(ORPHAN_OBSERVATION, f"{where}.tool_call_id",
                                 f"{call_id!r} is not a call of the assistant message {turn.where}")
        else:
            index = next((k for k in range(len(turn.calls)) if k not in turn.results), None)
        if index is None or index in turn.results:
            raise SkipRecord(ORPHAN_OBSERVATION, where, f"a second result for a call of {turn.where}")
        turn.results[index] = text

    def note(self, text: str) -> None:
        """User text after a step: part of that turn's observation."""
        assert self._open is not None, "a note before the first step belongs to the question"
        self._open.notes.append(text)

    def _close(self, last: bool = False) -> None:
        turn, self._open = self._open, None
        if turn is None:
            return
        if turn.calls and not last:
            answered = len(turn.results) == len(turn.calls) if self.result_per_call else bool(turn.results)
            if not answered:
                missing = [c["name"] for k, c in enumerate(turn.calls) if k not in turn.results]
                raise SkipRecord(MISSING_OBSERVATION, turn.where, f"the result of call(s) {missing} is missing "
                                                                  f"before the next step")
        results = [turn.results[k] for k in sorted(turn.results)]
        self._done.append({"reasoning": turn.reasoning, "action": turn.action,
                           "observation": joined([*results, *turn.notes], OBSERVATION_JOIN)})

    def turns(self) -> list[dict[str, Any]]:
        """Every turn; the last may lack its results (the log ended after the call)."""
        self._close(last=True)
        return self._done
