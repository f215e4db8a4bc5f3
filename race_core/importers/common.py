"""What every importer shares: the reasons a record is skipped, the success rule, the parts of a
message (text, reasoning, calls), `<think>` blocks, tool calls and their arguments, and the
assembly of turns from steps and results.

A format module turns one source record into a `Conversation` (question, system, tools, turns) or
raises `SkipRecord` naming the bad field; `race_core.importers` adds what every record gets
(environment, source revision, the source's ids) and validates the result with the contract.

A call's text that is not JSON may be a Python literal (the Hermes function-calling data sets write
`{'arguments': {'a': True}, 'name': 'f'}`): it is read with `ast.literal_eval` alone (never eval),
bounded in size and depth like JSON input, and must be a call (a string `name`, a dict `arguments`
or `parameters`) of JSON values. Every text read that way is kept (`normalised_calls`), so the
record's `extra["tool_call_text"]` says what was normalised.
"""

from __future__ import annotations

import ast
import contextlib
import json
import math
import re
from collections.abc import Iterator
from contextvars import ContextVar
from dataclasses import dataclass, field
from typing import Any

from race_core.schema import (
    BAD_SPLIT,
    BAD_TOOLS,
    DEFAULT_LIMITS,
    EMPTY_ACTION,
    MISSING_FIELD,
    NOT_OBJECT,
    NOT_SUCCESSFUL,
)

# Reasons a record is skipped (with the contract's own codes: not_json, line_too_long, bad_split, ...).
NO_SUCCESS_FLAG = "no_success_flag"  # the record says nothing about success and --assume-successful is off
BAD_SUCCESS_FLAG = "bad_success_flag"  # a success field of the wrong type
NO_QUESTION = "no_question"  # no user message (or Question) to take the question from
NO_TURNS = "no_turns"  # no assistant step at all
MALFORMED_MESSAGE = "malformed_message"  # a message or step that is not what its format says
MALFORMED_CALL = "malformed_call"  # a tool call without a name, arguments that are not a JSON object, ...
MISSING_OBSERVATION = "missing_observation"  # a call before the last turn without its result
ORPHAN_OBSERVATION = "orphan_observation"  # a result that answers no step before it
UNKNOWN_FORMAT = "unknown_format"  # --format auto: no format recognises the record
SKIP_CODES = (NOT_OBJECT, NOT_SUCCESSFUL, NO_SUCCESS_FLAG, BAD_SUCCESS_FLAG, BAD_SPLIT, MISSING_FIELD, NO_QUESTION,
              NO_TURNS, EMPTY_ACTION, MALFORMED_MESSAGE, MALFORMED_CALL, MISSING_OBSERVATION, ORPHAN_OBSERVATION,
              BAD_TOOLS, UNKNOWN_FORMAT)

SUCCESS_KEYS = ("successful", "success", "resolved")  # booleans, in this order of precedence
REWARD_KEY = "reward"  # true / false, or a number: success when >= MIN_REWARD
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
    extra: dict[str, Any] = field(default_factory=dict)  # what the source holds beyond the contract's fields
    # steps of one of two parallel records of a run that the other (the one followed: what the model
    # saw) leaves out, each {"index", "why", the step's fields}: written to extra[LEFT_OUT] and counted
    left_out: list[dict[str, Any]] = field(default_factory=list)


LEFT_OUT = "left_out_steps"  # the extra key of `Conversation.left_out`


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
    boolean `successful` / `success` / `resolved`, else `reward`, true / false or a number (success
    when >= 1); None when it has none of them (the format may know more)."""
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
    if isinstance(reward, bool):
        return reward, REWARD_KEY, reward
    if not isinstance(reward, (int, float)) or not math.isfinite(reward):
        raise SkipRecord(BAD_SUCCESS_FLAG, REWARD_KEY, f"must be true, false or a finite number, got {reward!r}")
    return reward >= MIN_REWARD, REWARD_KEY, reward


TEXT_PARTS = ("text", "input_text", "output_text")  # OpenAI chat / Responses text parts, LLaMA-Factory's text
REASONING_PARTS = ("reasoning", "thinking", "reasoning_text", "summary_text")
CALL_PARTS = ("tool_call",)  # LLaMA-Factory: the value is a JSON string of {"name", "arguments"}


@dataclass
class Parts:
    """A message's content read part by part."""

    text: str = ""
    reasoning: str = ""
    calls: list[dict[str, Any]] = field(default_factory=list)


def parts_of(content: Any, where: str) -> Parts:
    """A message's content: a string, null (nothing), or a list of parts. A part is a string, an
    OpenAI text part (`{"type": "text" | "input_text" | "output_text", "text"}`), a typed part of
    LLaMA-Factory (`{"type": "text" | "reasoning" | "tool_call", "value"}`), or a reasoning part
    (`{"type": "thinking", "thinking"}`, `{"type": "reasoning", "reasoning"}`, ...). Several parts
    of a kind are joined with newlines. Any other part (an image, audio) cannot be a trajectory's."""
    if content is None:
        return Parts()
    if isinstance(content, str):
        return Parts(text=content)
    if not isinstance(content, list):
        raise SkipRecord(MALFORMED_MESSAGE, where, f"must be a string or a list of parts, got {type(content).__name__}")
    texts, reasoning, calls = [], [], []
    for k, part in enumerate(content):
        at = f"{where}[{k}]"
        if isinstance(part, str):
            texts.append(part)
            continue
        kind = part.get("type") if isinstance(part, dict) else None
        if kind not in (*TEXT_PARTS, *REASONING_PARTS, *CALL_PARTS):
            raise SkipRecord(MALFORMED_MESSAGE, at, f"only text, reasoning and tool_call parts can be imported, got "
                                                    f"{kind if kind else type(part).__name__!r}")
        value = next((part[key] for key in ("value", "text", kind) if isinstance(part.get(key), str)), None)
        if value is None:
            raise SkipRecord(MALFORMED_MESSAGE, at, f"a {kind!r} part without its text (looked for 'value', 'text' "
                                                    f"and {kind!r})")
        if kind in CALL_PARTS:
            calls.extend(calls_from_json(value, f"{at}.value"))
        else:
            (reasoning if kind in REASONING_PARTS else texts).append(value)
    return Parts("\n".join(texts), "\n".join(r.strip() for r in reasoning), calls)


def text_of(content: Any, where: str) -> str:
    """A message's text (`parts_of`), where the source has no place for reasoning or calls."""
    parts = parts_of(content, where)
    if parts.reasoning or parts.calls:
        raise SkipRecord(MALFORMED_MESSAGE, where, "reasoning or tool_call parts where only text is expected")
    return parts.text


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


def json_object(text: str) -> dict[str, Any] | None:
    """The JSON object `text` holds, also when it is encoded twice (a JSON string whose content is
    the object's JSON); None when it holds none."""
    value: Any = text
    for _ in range(2):
        try:
            value = json.loads(value)
        except (json.JSONDecodeError, TypeError):
            return None
        if isinstance(value, dict):
            return value
        if not isinstance(value, str):
            return None
    return None


def arguments_of(value: Any, where: str) -> dict[str, Any]:
    """A call's arguments: an object, or a JSON string of one (OpenAI's form), also one encoded
    twice, or a Python-literal dict. Missing, null or an empty string is a call without arguments."""
    if value is None or (isinstance(value, str) and not value.strip()):
        return {}
    if isinstance(value, str):
        try:
            decoded = json.loads(value)
        except json.JSONDecodeError as exc:
            decoded, why = python_literal(value)
            if why is None and not isinstance(decoded, dict):
                why = f"a {type(decoded).__name__}, not a dict"
            if why is not None:
                raise SkipRecord(MALFORMED_CALL, where, f"is not valid JSON: {exc.msg} at column {exc.colno}; "
                                                        f"nor a Python literal dict: {why}") from None
            if (texts := _normalised.get()) is not None:
                texts.append({"at": where, "text": value})
        value = json_object(decoded) if isinstance(decoded, str) else decoded
        if value is None:
            raise SkipRecord(MALFORMED_CALL, where, "a JSON string whose content is not a JSON object")
    if not isinstance(value, dict):
        raise SkipRecord(MALFORMED_CALL, where, f"must be a JSON object, got {type(value).__name__}")
    return value


def tool_call(name: Any, arguments: Any, where: str, call_id: Any = None) -> dict[str, Any]:
    """One call in the contract's form, `{"name", "arguments"}`, with the source's call id when it
    has one (the contract's place for it)."""
    if not isinstance(name, str) or not name.strip():
        raise SkipRecord(MALFORMED_CALL, f"{where}.name", f"must be a non-empty string, got {name!r}")
    call = {"name": name, "arguments": arguments_of(arguments, f"{where}.arguments")}
    if call_id is not None and not isinstance(call_id, str):
        raise SkipRecord(MALFORMED_CALL, f"{where}.id", f"must be a string, got {type(call_id).__name__}")
    if call_id:
        call["id"] = call_id
    return call


def call_objects(raw: Any, where: str) -> list[tuple[str, dict[str, Any]]]:
    """(where, call) for each call of a source's list of calls (null: none), each an object."""
    if raw is None:
        return []
    if not isinstance(raw, list):
        raise SkipRecord(MALFORMED_CALL, where, f"must be a list, got {type(raw).__name__}")
    for k, call in enumerate(raw):
        if not isinstance(call, dict):
            raise SkipRecord(MALFORMED_CALL, f"{where}[{k}]", f"must be an object, got {type(call).__name__}")
    return [(f"{where}[{k}]", call) for k, call in enumerate(raw)]


MAX_LITERAL_CHARS = DEFAULT_LIMITS.max_field_chars  # a Python-literal call's text, as a JSON field's
MAX_LITERAL_DEPTH = DEFAULT_LIMITS.max_depth  # its nesting, as JSON input's
_LITERAL_NODES = (ast.Expression, ast.Dict, ast.List, ast.Tuple, ast.Constant, ast.UnaryOp, ast.USub, ast.UAdd,
                  ast.Load)
_normalised: ContextVar[list[dict[str, str]] | None] = ContextVar("normalised_calls", default=None)


@contextlib.contextmanager
def normalised_calls() -> Iterator[list[dict[str, str]]]:
    """Collects, while open, every call text read as a Python literal: `{"at": where, "text": text}`."""
    texts: list[dict[str, str]] = []
    token = _normalised.set(texts)
    try:
        yield texts
    finally:
        _normalised.reset(token)


def python_literal(text: str) -> tuple[Any, str | None]:
    """(value, None) for a text that is one Python literal of JSON values (dicts with string keys,
    lists or tuples, strings, finite numbers, True / False / None); (None, why not) otherwise. Read
    by `ast.literal_eval` over a parsed tree of literal nodes only, at most MAX_LITERAL_CHARS long
    and MAX_LITERAL_DEPTH deep."""
    if len(text) > MAX_LITERAL_CHARS:
        return None, f"longer than {MAX_LITERAL_CHARS} characters"
    try:
        tree = ast.parse(text.strip(), mode="eval")
    except (SyntaxError, ValueError, RecursionError, MemoryError) as exc:
        return None, f"{type(exc).__name__}: {getattr(exc, 'msg', None) or exc}"
    depth: dict[int, int] = {id(tree): 0}
    for node in ast.walk(tree):
        if not isinstance(node, _LITERAL_NODES):
            return None, f"{type(node).__name__} is not a literal"
        for child in ast.iter_child_nodes(node):
            depth[id(child)] = depth[id(node)] + isinstance(child, ast.Dict | ast.List | ast.Tuple)
            if depth[id(child)] > MAX_LITERAL_DEPTH:
                return None, f"nested deeper than {MAX_LITERAL_DEPTH}"
    try:
        value = ast.literal_eval(tree)
    except (ValueError, TypeError, SyntaxError, RecursionError, MemoryError) as exc:
        return None, f"{type(exc).__name__}: {exc}"
    try:
        return _json_value(value), None
    except ValueError as exc:
        return None, str(exc)


def _json_value(value: Any) -> Any:
    """`value` as JSON would hold it (tuples as lists); ValueError naming what JSON cannot hold."""
    if value is None or isinstance(value, bool | str):
        return value
    if isinstance(value, int | float):
        if isinstance(value, float) and not math.isfinite(value):
            raise ValueError(f"{value!r} is not a finite number")
        return value
    if isinstance(value, list | tuple):
        return [_json_value(v) for v in value]
    if isinstance(value, dict):
        if not all(isinstance(k, str) for k in value):
            raise ValueError("a dict key that is not a string")
        return {k: _json_value(v) for k, v in value.items()}
    raise ValueError(f"a {type(value).__name__}, which JSON cannot hold")


def _literal_call(text: str, json_error: json.JSONDecodeError, where: str) -> Any:
    """The call(s) a Python-literal text holds (recorded by `normalised_calls`); else `SkipRecord`
    giving both parsers' reasons."""
    value, why = python_literal(text)
    calls = value if isinstance(value, list) else [value]
    if why is None and not (calls and all(_is_call_object(c) for c in calls)):
        why = "not a call (a string 'name' and a dict 'arguments' or 'parameters')"
    if why is not None:
        raise SkipRecord(MALFORMED_CALL, where, f"is not valid JSON: {json_error.msg} at column {json_error.colno}; "
                                                f"nor a Python literal call: {why}")
    if (texts := _normalised.get()) is not None:
        texts.append({"at": where, "text": text})
    return value


def _is_call_object(call: Any) -> bool:
    arguments = call.get("arguments", call.get("parameters")) if isinstance(call, dict) else None
    return isinstance(call, dict) and isinstance(call.get("name"), str) and isinstance(arguments, dict)


# Glaive's function calls quote the arguments' JSON in single quotes: {"name": "f", "arguments": '{"a": 1}'}
_SINGLE_QUOTED_ARGUMENTS = re.compile(
    r'\A\s*\{\s*"name"\s*:\s*("(?:[^"\\]|\\.)*")\s*,\s*"arguments"\s*:\s*\'(.*)\'\s*}\s*\Z', re.DOTALL)


def calls_from_json(text: str, where: str) -> list[dict[str, Any]]:
    """The calls a JSON text holds: one `{"name", "arguments"}` object (Llama's `parameters` for
    `arguments` too) or a list of them (parallel calls), `arguments` an object or a JSON string of
    one (Glaive's single-quoted one too); a text that is not JSON may be a Python-literal call."""
    try:
        parsed = json.loads(text)
    except json.JSONDecodeError as exc:
        quoted = _SINGLE_QUOTED_ARGUMENTS.match(text)
        if quoted is None:
            parsed = _literal_call(text, exc, where)
        else:
            parsed = {"name": json.loads(quoted.group(1)), "arguments": quoted.group(2)}
    objects = parsed if isinstance(parsed, list) else [parsed]
    if not objects:
        raise SkipRecord(MALFORMED_CALL, where, "an empty list of calls")
    calls = []
    for k, call in enumerate(objects):
        at = where + (f"[{k}]" if isinstance(parsed, list) else "")
        if not isinstance(call, dict):
            raise SkipRecord(MALFORMED_CALL, at, f"a call must be an object, got {type(call).__name__}")
        arguments = call["arguments"] if "arguments" in call else call.get("parameters")
        calls.append(tool_call(call.get("name"), arguments, at))
    return calls


def is_call_json(value: Any) -> bool:
    """Whether a parsed JSON value is a call object (`{"name": str, "arguments": object}`, maybe
    with an id) or a non-empty list of them: how a text that is exactly that is known for a call."""
    objects = value if isinstance(value, list) and value else [value]
    return all(isinstance(c, dict) and isinstance(c.get("name"), str) and isinstance(c.get("arguments"), dict)
               and set(c) <= {"name", "arguments", "id"} for c in objects)


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
    observed: str | None = None  # one observation of the whole step (ReAct's Observation:)
    notes: list[str] = field(default_factory=list)  # user text after the assistant message


class TurnBuilder:
    """Turns from a message list: each assistant step opens a turn; the results of its calls (in
    call order, whatever order they came in), or one observation of the whole step, and then any
    user text before the next step make its observation. A result after a text action is that
    action's observation. A call before the last turn must have its result: a log that lost it is
    skipped rather than trained on with a made-up empty observation. `result_per_call=False`: the
    source's results name no call (ShareGPT), and a calling turn needs at least one."""

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
        """A tool result: for the call with `call_id`, or (no id) the first call not yet answered;
        after a text action, its observation."""
        turn = self._open
        if turn is None:
            raise SkipRecord(ORPHAN_OBSERVATION, where, "a tool result with no step before it")
        if call_id is not None and not isinstance(call_id, str):
            raise SkipRecord(MALFORMED_MESSAGE, f"{where}.tool_call_id", f"must be a string, got {call_id!r}")
        if not turn.calls or not self.result_per_call:
            if call_id and not turn.calls:
                raise SkipRecord(ORPHAN_OBSERVATION, f"{where}.tool_call_id",
                                 f"{call_id!r} answers a call, but {turn.where} has no tool call")
            turn.results[len(turn.results)] = text
            return
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

    def observe(self, text: str, where: str) -> None:
        """One observation of the whole open step (ReAct's `Observation:`): the results of all its
        calls together, or a text action's observation."""
        turn = self._open
        if turn is None:
            raise SkipRecord(ORPHAN_OBSERVATION, where, "an Observation with no step before it")
        if turn.observed is not None or turn.results:
            turn.notes.append(text)
        else:
            turn.observed = text

    def note(self, text: str) -> None:
        """User text after a step: part of that turn's observation."""
        assert self._open is not None, "a note before the first step belongs to the question"
        self._open.notes.append(text)

    def _close(self, last: bool = False) -> None:
        turn, self._open = self._open, None
        if turn is None:
            return
        if turn.calls and not last and turn.observed is None:
            answered = len(turn.results) == len(turn.calls) if self.result_per_call else bool(turn.results)
            if not answered:
                missing = [c["name"] for k, c in enumerate(turn.calls) if k not in turn.results]
                raise SkipRecord(MISSING_OBSERVATION, turn.where, f"the result of call(s) {missing} is missing "
                                                                  f"before the next step")
        results = [turn.results[k] for k in sorted(turn.results)]
        observed = [] if turn.observed is None else [turn.observed]
        self._done.append({"reasoning": turn.reasoning, "action": turn.action,
                           "observation": joined([*observed, *results, *turn.notes], OBSERVATION_JOIN)})

    def turns(self) -> list[dict[str, Any]]:
        """Every turn; the last may lack its results (the log ended after the call)."""
        self._close(last=True)
        return self._done
